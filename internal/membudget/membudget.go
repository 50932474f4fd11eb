// Package membudget bounds the memory that request bodies (and what
// decoding them allocates) take in the daemon at once. Bodies are read
// whole: the /v1 proxy routes on their "model" and holds them during a
// switch; /api and /mcp decode them. Without a shared bound N concurrent
// clients multiply whatever one request may cost. One Budget is shared by
// every request it covers; a request reserves before it allocates and
// gives back when it is done, and a request that does not fit is refused
// (503 + Retry-After in the caller's shape) instead of waiting.
package membudget

import (
	"errors"
	"io"
	"sync"
)

// Budget is a count of bytes reserved against a limit.
type Budget struct {
	mu    sync.Mutex
	used  int64
	limit int64
}

// New returns a budget of limit bytes.
func New(limit int64) *Budget { return &Budget{limit: limit} }

// Take reserves n bytes; false when they do not fit.
func (b *Budget) Take(n int64) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if n > b.limit-b.used {
		return false
	}
	b.used += n
	return true
}

// Give returns n reserved bytes.
func (b *Budget) Give(n int64) {
	b.mu.Lock()
	b.used -= n
	b.mu.Unlock()
}

// Used is what is reserved now.
func (b *Budget) Used() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Limit is the budget's size.
func (b *Budget) Limit() int64 { return b.limit }

// ErrOver is returned when a reservation does not fit.
var ErrOver = errors.New("the memory budget for request bodies is used up")

// FirstChunk is the buffer a body of unannounced length starts with; it
// doubles from there.
const FirstChunk = 32 << 10

// Read reads r whole (at most limit+1 bytes, so the caller can tell a body
// over limit) and counts the buffers' capacity, not the bytes read,
// against b: what the daemon holds is the buffer (counting bytes read let
// a doubling buffer hold ~1.7× the budget). An announced length (> 0) is
// reserved and allocated once, exactly; an unannounced one grows by
// doubling, each new buffer reserved before it is allocated (the old one
// is still held during the copy) and the old one given back after.
// reserved is what the caller gives back when the body is no longer
// needed, also after an error.
func Read(r io.Reader, b *Budget, announced, limit int64) (body []byte, reserved int64, err error) {
	size := int64(FirstChunk)
	if announced > 0 {
		size = announced
	}
	size = min(size, limit+1)
	if !b.Take(size) {
		return nil, 0, ErrOver
	}
	reserved = size
	buf := make([]byte, 0, size)
	lr := io.LimitReader(r, limit+1)
	for {
		if len(buf) == cap(buf) {
			if int64(cap(buf)) > limit {
				return buf, reserved, nil // over limit: the caller refuses it
			}
			// A full buffer grows only when more than it holds arrives
			// (a body of exactly the announced length never does).
			var one [1]byte
			n, rerr := io.ReadFull(lr, one[:])
			if n == 0 {
				if rerr == io.EOF {
					return buf, reserved, nil
				}
				return nil, reserved, rerr
			}
			next := min(2*int64(cap(buf)), limit+1)
			if !b.Take(next) {
				return nil, reserved, ErrOver
			}
			grown := make([]byte, len(buf), next)
			copy(grown, buf)
			b.Give(reserved)
			buf, reserved = append(grown, one[0]), next
		}
		n, rerr := lr.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if rerr == io.EOF {
			return buf, reserved, nil
		}
		if rerr != nil {
			return nil, reserved, rerr
		}
	}
}
