package dovecottest

import (
	"io"
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// Cut says where an armed Relay cuts: in the Literal-th body
// literal the server sends after arming (1-based), once After bytes of it
// have been forwarded (After at or beyond the literal's size: right after
// its last byte, before the closing parenthesis and the tagged OK).
type Cut struct {
	Literal int
	After   int
}

// CutInfo records a cut: the FETCH line that opened the literal
// (e.g. `* 3 FETCH (UID 3 BODY[] {81}`), its size and how many of its
// bytes reached the client.
type CutInfo struct {
	Line      string
	Size      int
	Forwarded int
}

// bodyLiteral matches the end of a FETCH line that opens a body-section
// literal: BODY[] {n}, BODY[HEADER] {n}, ...
var bodyLiteral = regexp.MustCompile(`BODY\[[^\]]*\] \{(\d+)\}\r\n$`)

// Relay is a TCP relay between an IMAP client and Dovecot, for tests of
// a connection that drops in the middle of a FETCH. Disarmed it
// forwards every byte; armed (one shot) it follows the server's bytes,
// finds the literals of FETCH body sections and, in the chosen one, closes
// both sides after exactly the chosen number of literal bytes. The cut is
// placed by byte position, not by time, so it lands in the same place on
// every run however the bytes are chunked.
type Relay struct {
	t       testing.TB
	ln      net.Listener
	backend string
	wg      sync.WaitGroup

	mu       sync.Mutex
	armed    *Cut
	seen     int // body literals since arming
	cuts     []CutInfo
	accepted int
	conns    map[net.Conn]struct{}
}

// NewRelay listens on a spare loopback port and relays every connection to
// backend (the Dovecot address) until the test ends.
func NewRelay(t testing.TB, backend string) *Relay {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("relay: listen: %v", err)
	}
	r := &Relay{t: t, ln: ln, backend: backend, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.serve()
	t.Cleanup(func() {
		ln.Close()
		r.mu.Lock()
		for c := range r.conns {
			c.Close()
		}
		r.mu.Unlock()
		r.wg.Wait()
	})
	return r
}

// Addr is the relay's host:port, for the client to dial.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

// Arm makes the relay cut once, as c says.
func (r *Relay) Arm(c Cut) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.armed, r.seen = &c, 0
}

// Cuts returns the cuts so far.
func (r *Relay) Cuts() []CutInfo {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.cuts)
}

// Accepted is how many client connections the relay has taken.
func (r *Relay) Accepted() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.accepted
}

func (r *Relay) serve() {
	defer r.wg.Done()
	for {
		client, err := r.ln.Accept()
		if err != nil {
			return
		}
		server, err := net.DialTimeout("tcp", r.backend, 10*time.Second)
		if err != nil {
			r.t.Errorf("relay: dial %s: %v", r.backend, err)
			client.Close()
			continue
		}
		r.mu.Lock()
		r.accepted++
		r.conns[client], r.conns[server] = struct{}{}, struct{}{}
		r.mu.Unlock()
		var once sync.Once
		closeBoth := func() {
			once.Do(func() {
				client.Close()
				server.Close()
				r.mu.Lock()
				delete(r.conns, client)
				delete(r.conns, server)
				r.mu.Unlock()
			})
		}
		r.wg.Add(2)
		go func() {
			defer r.wg.Done()
			defer closeBoth()
			_, _ = io.Copy(server, client)
		}()
		go func() {
			defer r.wg.Done()
			defer closeBoth()
			r.pump(client, server)
		}()
	}
}

// pump forwards the server's bytes to the client, cutting where armed.
func (r *Relay) pump(client, server net.Conn) {
	buf := make([]byte, 32<<10)
	var (
		tail           []byte // recent bytes outside literals
		litSize, inLit int    // the current literal's size and bytes forwarded
		cutAt          = -1   // in the current literal; -1: none
		line           string
	)
	for {
		n, rerr := server.Read(buf)
		chunk, out, cut := buf[:n], buf[:n], false
		for i := 0; i < len(chunk) && !cut; {
			if inLit < litSize {
				k := min(litSize-inLit, len(chunk)-i)
				if cutAt >= 0 && inLit+k >= cutAt {
					out, cut = chunk[:i+cutAt-inLit], true
					inLit = cutAt
					break
				}
				inLit += k
				i += k
				continue
			}
			tail = append(tail, chunk[i])
			i++
			if len(tail) > 512 {
				tail = slices.Delete(tail, 0, len(tail)-512)
			}
			m := bodyLiteral.FindSubmatch(tail)
			if m == nil {
				continue
			}
			size, err := strconv.Atoi(string(m[1]))
			if err != nil || size == 0 {
				continue
			}
			line = string(tail[:len(tail)-2])
			if i := strings.LastIndex(line, "\r\n"); i >= 0 {
				line = line[i+2:]
			}
			litSize, inLit, cutAt = size, 0, r.nextLiteral(size)
			tail = tail[:0]
		}
		if _, err := client.Write(out); err != nil {
			return
		}
		if cut {
			r.mu.Lock()
			r.cuts = append(r.cuts, CutInfo{Line: line, Size: litSize, Forwarded: inLit})
			r.mu.Unlock()
			return // closes both sides
		}
		if rerr != nil {
			return
		}
	}
}

// nextLiteral counts a body literal of size bytes and returns where to cut
// in it, or -1.
func (r *Relay) nextLiteral(size int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.armed == nil {
		return -1
	}
	r.seen++
	if r.seen != r.armed.Literal {
		return -1
	}
	at := min(r.armed.After, size)
	r.armed = nil
	return at
}

// checkDropError checks a call's error after a cut: it must be one (the
// mail must not look processed or missing), name the source's address and
// the command, and not be mistaken for a missing mail.
