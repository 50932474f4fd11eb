package membudget

import (
	"bytes"
	"errors"
	"testing"
	"testing/iotest"
)

// Read counts what the buffers hold, not what was read: the
// budget's use is the body's capacity while it is held and zero after it
// is given back (before: bytes read were counted while bytes.Buffer
// doubled, and RSS reached ~1.7× the budget).
func TestReadCountsCapacity(t *testing.T) {
	const limit = 1 << 20
	tests := []struct {
		name      string
		size      int
		announced int64
		budget    int64
		wantCap   int   // 0: any cap ≥ size
		wantErr   error // ErrOver or nil
		tooBig    bool
	}{
		{"announced is allocated exactly", 300_000, 300_000, limit, 300_000, nil, false},
		{"announced exactly the budget", 300_000, 300_000, 300_000, 300_000, nil, false},
		{"announced over the budget", 300_000, 300_000, 299_999, 0, ErrOver, false},
		{"chunked small", 1000, -1, limit, FirstChunk, nil, false},
		{"chunked exactly one chunk", FirstChunk, -1, limit, FirstChunk, nil, false},
		{"chunked grows by doubling", 100_000, -1, limit, 128 << 10, nil, false},
		// 100 kB read fit a 150 kB budget, but the buffers that hold them
		// do not (64 KiB while 128 KiB is allocated): refused.
		{"chunked doubling over the budget", 100_000, -1, 150_000, 0, ErrOver, false},
		{"chunked over the limit", limit + 10, -1, 4 * limit, limit + 1, nil, true},
		{"empty chunked", 0, -1, limit, FirstChunk, nil, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			in := bytes.Repeat([]byte("x"), tc.size)
			b := New(tc.budget)
			// One byte per Read: the worst case for growth.
			body, reserved, err := Read(iotest.OneByteReader(bytes.NewReader(in)), b, tc.announced, limit)
			if !errors.Is(err, tc.wantErr) {
				t.Fatalf("err %v, want %v", err, tc.wantErr)
			}
			if b.used != reserved {
				t.Errorf("budget used %d, reserved %d: they must agree", b.used, reserved)
			}
			if b.used > tc.budget {
				t.Errorf("budget used %d over its limit %d", b.used, tc.budget)
			}
			if err == nil {
				if int64(cap(body)) > reserved {
					t.Errorf("cap %d > reserved %d: the buffer holds more than it counts", cap(body), reserved)
				}
				if tc.wantCap != 0 && cap(body) != tc.wantCap {
					t.Errorf("cap %d, want %d", cap(body), tc.wantCap)
				}
				if tc.tooBig != (len(body) > limit) {
					t.Errorf("len %d, over limit = %v, want %v", len(body), len(body) > limit, tc.tooBig)
				}
				if !tc.tooBig && !bytes.Equal(body, in) {
					t.Errorf("body of %d bytes, want the %d sent", len(body), len(in))
				}
			}
			b.Give(reserved)
			if b.used != 0 {
				t.Errorf("after give: used %d, want 0", b.used)
			}
		})
	}
}

// FuzzRead: whatever arrives, the budget's use equals what is
// reserved, never passes the budget, covers the buffer, and the body
// (when not over the limit) is what was sent.
func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"model":"m"}`), int64(-1), int64(64), int64(1<<16))
	f.Add(bytes.Repeat([]byte("y"), 5000), int64(5000), int64(4096), int64(8000))
	f.Fuzz(func(t *testing.T, in []byte, announced, limit, budget int64) {
		if limit < 1 || limit > 1<<20 || budget < 0 || budget > 1<<22 {
			t.Skip()
		}
		if announced > 0 {
			announced = min(announced, int64(len(in)))
			in = in[:announced]
		}
		b := New(budget)
		body, reserved, err := Read(bytes.NewReader(in), b, announced, limit)
		if b.used != reserved || b.used > budget {
			t.Fatalf("used %d reserved %d budget %d", b.used, reserved, budget)
		}
		if err == nil {
			if int64(cap(body)) > reserved {
				t.Fatalf("cap %d > reserved %d", cap(body), reserved)
			}
			if int64(len(in)) <= limit && !bytes.Equal(body, in) {
				t.Fatalf("body %q, want %q", body, in)
			}
		}
	})
}
