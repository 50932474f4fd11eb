package source

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"gpuhost/triage/source/dovecottest"
)

func checkDropError(t *testing.T, err error, addr string) {
	t.Helper()
	switch {
	case err == nil:
		t.Fatal("the call succeeded although the connection was cut in the middle of a body")
	case errors.Is(err, ErrNotFound):
		t.Fatalf("a cut connection reads as a missing mail: %v", err)
	case !strings.Contains(err.Error(), addr) || !strings.Contains(err.Error(), "UID FETCH"):
		t.Fatalf("error %q does not name the address %s and the FETCH", err, addr)
	}
	t.Logf("error after the cut: %v", err)
}

// checkCut checks that the relay cut exactly once, in the literal opened
// by a FETCH line containing wantLine, after forwarded bytes of it.
func checkCut(t *testing.T, r *dovecottest.Relay, before int, wantLine string, forwarded int) {
	t.Helper()
	cuts := r.Cuts()
	if len(cuts) != before+1 {
		t.Fatalf("relay cut %d times during the call, want once (cuts %+v)", len(cuts)-before, cuts)
	}
	c := cuts[before]
	if !strings.Contains(c.Line, wantLine) || c.Forwarded != forwarded {
		t.Fatalf("cut in %q after %d of %d bytes; want a line with %q after %d bytes", c.Line, c.Forwarded, c.Size, wantLine, forwarded)
	}
}

// TestDropMidFetchLiteral: Dovecot's connection is cut in the middle of a
// FETCH response, at chosen byte positions inside the message literals.
// Fetch must fail with an error naming the server and the command (no
// partial batch), and the next Fetch must reconnect and return the same
// mails, whole and in order.
func TestDropMidFetchLiteral(t *testing.T) {
	srv := dovecottest.Start(t, dovecottest.Options{})
	relay := dovecottest.NewRelay(t, srv.Addr)
	ctx := ctxT(t)

	var uids []uint32
	raws := map[uint32][]byte{}
	for i := range 5 {
		raw := testMail(100 + i)
		uid := srv.Append(t, raw)
		uids = append(uids, uid)
		raws[uid] = raw
	}
	// Above maxBytes: its header comes in a FETCH of its own after the
	// bodies.
	big, bigHeader := bigMail(8 << 10)
	bigUID := srv.Append(t, big)
	const maxBytes = 4 << 10
	all := append(slices.Clone(uids), bigUID)

	tests := []struct {
		name      string
		cut       dovecottest.Cut
		wantLine  string
		forwarded int
		wantErr   string
	}{
		{"first body of the batch", dovecottest.Cut{Literal: 1, After: 20}, fmt.Sprintf("UID %d BODY[] {", uids[0]), 20,
			fmt.Sprintf("(UID %d): the connection ended after 20 of the %d bytes", uids[0], len(raws[uids[0]]))},
		{"third body of the batch", dovecottest.Cut{Literal: 3, After: 37}, fmt.Sprintf("UID %d BODY[] {", uids[2]), 37,
			fmt.Sprintf("(UID %d): the connection ended after 37 of the %d bytes", uids[2], len(raws[uids[2]]))},
		{"at the start of a body", dovecottest.Cut{Literal: 2, After: 0}, fmt.Sprintf("UID %d BODY[] {", uids[1]), 0,
			fmt.Sprintf("(UID %d): the connection ended after 0 of the %d bytes", uids[1], len(raws[uids[1]]))},
		{"after the last body, before OK", dovecottest.Cut{Literal: 5, After: 1 << 20}, fmt.Sprintf("UID %d BODY[] {", uids[4]), len(raws[uids[4]]),
			"unexpected EOF"},
		{"header of the large mail", dovecottest.Cut{Literal: 6, After: 10}, fmt.Sprintf("UID %d BODY[HEADER] {", bigUID), 10,
			fmt.Sprintf("(UID %d): the connection ended after 10 of the %d bytes", bigUID, len(bigHeader))},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := newIMAPFor(srv, func(o *IMAPOptions) { o.Addr = relay.Addr() })
			defer src.Close()
			conns := relay.Accepted()
			// A live session first: the cut hits an established
			// connection, not the login.
			if b, err := src.Fetch(ctx, bigUID, 0, maxBytes); err != nil || len(b.Mails) != 0 {
				t.Fatalf("Fetch after the last UID: %v, %v", uidsOf(b.Mails), err)
			}

			cuts := len(relay.Cuts())
			relay.Arm(tc.cut)
			b, err := src.Fetch(ctx, 0, 0, maxBytes)
			checkDropError(t, err, relay.Addr())
			checkCut(t, relay, cuts, tc.wantLine, tc.forwarded)
			if !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("error %q does not say %q", err, tc.wantErr)
			}
			if len(b.Mails) != 0 {
				t.Fatalf("a failed Fetch returned mails %v", uidsOf(b.Mails))
			}

			b, err = src.Fetch(ctx, 0, 0, maxBytes)
			if err != nil {
				t.Fatalf("Fetch after the cut did not reconnect: %v", err)
			}
			if got := uidsOf(b.Mails); !slices.Equal(got, all) {
				t.Fatalf("after the cut: UIDs %v, want %v", got, all)
			}
			for _, m := range b.Mails {
				want, ho := raws[m.UID], false
				if m.UID == bigUID {
					want, ho = bigHeader, true
				}
				if !bytes.Equal(m.Raw, want) || m.HeaderOnly != ho {
					t.Errorf("UID %d after the cut: %d bytes (HeaderOnly %v), want %d (HeaderOnly %v)", m.UID, len(m.Raw), m.HeaderOnly, len(want), ho)
				}
			}
			if got := relay.Accepted() - conns; got != 2 {
				t.Errorf("%d connections through the relay, want 2 (the cut one and one reconnect)", got)
			}
		})
	}
}

// TestDropMidGetLiteral: manual mode's Get, cut in the middle of the
// mail's literal, fails with a clear error (not ErrNotFound), and the next
// Get reconnects and returns the mail whole.
func TestDropMidGetLiteral(t *testing.T) {
	srv := dovecottest.Start(t, dovecottest.Options{})
	relay := dovecottest.NewRelay(t, srv.Addr)
	ctx := ctxT(t)
	raw := testMail(7)
	uid := srv.Append(t, raw)
	big, bigHeader := bigMail(8 << 10)
	bigUID := srv.Append(t, big)

	tests := []struct {
		name     string
		uid      uint32
		maxBytes int64
		want     []byte
		wantLine string
	}{
		{"whole mail", uid, 0, raw, fmt.Sprintf("UID %d BODY[] {", uid)},
		{"header of a large mail", bigUID, 1 << 10, bigHeader, fmt.Sprintf("UID %d BODY[HEADER] {", bigUID)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			src := newIMAPFor(srv, func(o *IMAPOptions) { o.Addr = relay.Addr() })
			defer src.Close()
			cuts := len(relay.Cuts())
			relay.Arm(dovecottest.Cut{Literal: 1, After: 15})
			_, err := src.Get(ctx, tc.uid, tc.maxBytes)
			checkDropError(t, err, relay.Addr())
			checkCut(t, relay, cuts, tc.wantLine, 15)
			if want := fmt.Sprintf("(UID %d): the connection ended after 15 of the %d bytes", tc.uid, len(tc.want)); !strings.Contains(err.Error(), want) {
				t.Errorf("error %q does not say %q", err, want)
			}

			m, err := src.Get(ctx, tc.uid, tc.maxBytes)
			if err != nil {
				t.Fatalf("Get after the cut did not reconnect: %v", err)
			}
			if m.UID != tc.uid || !bytes.Equal(m.Raw, tc.want) {
				t.Fatalf("Get after the cut: UID %d, %d bytes; want UID %d, %d bytes", m.UID, len(m.Raw), tc.uid, len(tc.want))
			}
		})
	}
}
