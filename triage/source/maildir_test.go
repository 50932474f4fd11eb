package source

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// newMaildirDir makes an empty Maildir folder.
func newMaildirDir(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "Maildir")
	for _, sub := range []string{"cur", "new", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// deliver writes a mail file the way an MDA does (tmp/, then rename).
func deliver(t *testing.T, dir, sub, name string, raw []byte) string {
	t.Helper()
	tmp := filepath.Join(dir, "tmp", name)
	if err := os.WriteFile(tmp, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, sub, name)
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	return p
}

func mustFetch(t *testing.T, m *Maildir, after uint32, limit int, maxBytes int64) Batch {
	t.Helper()
	b, err := m.Fetch(context.Background(), after, limit, maxBytes)
	if err != nil {
		t.Fatalf("Fetch(%d, %d, %d): %v", after, limit, maxBytes, err)
	}
	return b
}

// subjects maps the fetched mails to their Subject lines, in order.
func subjects(mails []Mail) []string {
	var out []string
	for _, m := range mails {
		for _, line := range strings.Split(string(m.Raw), "\n") {
			if s, ok := strings.CutPrefix(strings.TrimRight(line, "\r"), "Subject: "); ok {
				out = append(out, s)
			}
		}
	}
	return out
}

func mailWithSubject(s string) []byte {
	return []byte("From: a@example.com\nSubject: " + s + "\n\nbody of " + s + "\n")
}

func TestMaildirOrderAndFiltering(t *testing.T) {
	type file struct{ sub, name, subject string }
	tests := []struct {
		name  string
		files []file
		// garbage is created besides the mail files and must be ignored.
		garbage func(t *testing.T, dir string)
		want    []string // subjects in UID order
	}{
		{
			name: "delivery timestamp orders, not file name or directory",
			files: []file{
				{"new", "1700000300.M1P1.host", "third"},
				{"cur", "1700000100.M1P1.host:2,S", "first"},
				{"new", "1700000200.M9P9.host", "second"},
			},
			want: []string{"first", "second", "third"},
		},
		{
			name: "same second: name breaks the tie",
			files: []file{
				{"new", "1700000000.M2P1.host", "b"},
				{"new", "1700000000.M1P1.host", "a"},
			},
			want: []string{"a", "b"},
		},
		{
			name: "garbage is ignored",
			files: []file{
				{"new", "1700000000.M1P1.host", "mail"},
			},
			garbage: func(t *testing.T, dir string) {
				for _, p := range []string{"new/.hidden", "cur/.1700000000.M5.host", "tmp/1600000000.M1.host", "stray-in-root"} {
					if err := os.WriteFile(filepath.Join(dir, p), mailWithSubject("garbage "+p), 0o600); err != nil {
						t.Fatal(err)
					}
				}
				for _, d := range []string{"new/1600000000.M1.dir", "cur/subdir"} {
					if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
						t.Fatal(err)
					}
				}
				if err := os.Symlink("/etc/passwd", filepath.Join(dir, "new", "1600000000.M2.link")); err != nil {
					t.Fatal(err)
				}
			},
			want: []string{"mail"},
		},
		{
			name: "names without a timestamp sort by their time of delivery",
			files: []file{
				{"new", "1700000000.M1P1.host", "stamped"},
				{"new", "handmade-mail", "handmade"}, // mtime now: after 2023
			},
			want: []string{"stamped", "handmade"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := newMaildirDir(t)
			for _, f := range tc.files {
				deliver(t, dir, f.sub, f.name, mailWithSubject(f.subject))
			}
			if tc.garbage != nil {
				tc.garbage(t, dir)
			}
			m, err := NewMaildir(dir)
			if err != nil {
				t.Fatal(err)
			}
			b := mustFetch(t, m, 0, 0, 0)
			if got := subjects(b.Mails); !slices.Equal(got, tc.want) {
				t.Fatalf("subjects %v, want %v", got, tc.want)
			}
			for i, mail := range b.Mails {
				if mail.UID != uint32(i+1) || mail.HeaderOnly || mail.Size != int64(len(mail.Raw)) {
					t.Errorf("mail %d: UID %d HeaderOnly %v Size %d (raw %d)", i, mail.UID, mail.HeaderOnly, mail.Size, len(mail.Raw))
				}
			}
			if b.UIDValidity == 0 || b.HighestUID != uint32(len(tc.want)) {
				t.Errorf("UIDVALIDITY %d HighestUID %d", b.UIDValidity, b.HighestUID)
			}
		})
	}
}

func TestMaildirUIDsPersistAndNeverMove(t *testing.T) {
	dir := newMaildirDir(t)
	p1 := deliver(t, dir, "new", "1700000100.M1P1.host", mailWithSubject("one"))
	deliver(t, dir, "new", "1700000200.M1P1.host", mailWithSubject("two"))
	m, err := NewMaildir(dir)
	if err != nil {
		t.Fatal(err)
	}
	if m.Name() != "maildir:"+dir {
		t.Errorf("Name() = %q", m.Name())
	}
	b1 := mustFetch(t, m, 0, 0, 0)

	// A mail client reads "one": new/ → cur/ with flags. It keeps UID 1.
	if err := os.Rename(p1, filepath.Join(dir, "cur", "1700000100.M1P1.host:2,S")); err != nil {
		t.Fatal(err)
	}
	// An older-stamped mail delivered later still gets a higher UID.
	deliver(t, dir, "new", "1600000000.M1P1.host", mailWithSubject("late"))

	// A new process (restart) sees the same UIDs and UIDVALIDITY.
	m2, err := NewMaildir(dir)
	if err != nil {
		t.Fatal(err)
	}
	b2 := mustFetch(t, m2, 0, 0, 0)
	if b2.UIDValidity != b1.UIDValidity {
		t.Fatalf("UIDVALIDITY changed across restarts: %d → %d", b1.UIDValidity, b2.UIDValidity)
	}
	if got, want := subjects(b2.Mails), []string{"one", "two", "late"}; !slices.Equal(got, want) {
		t.Fatalf("after restart: %v, want %v", got, want)
	}
	if got := uidsOf(b2.Mails); !slices.Equal(got, []uint32{1, 2, 3}) {
		t.Fatalf("UIDs %v, want [1 2 3]", got)
	}
	if nb := mustFetch(t, m2, 2, 0, 0); !slices.Equal(subjects(nb.Mails), []string{"late"}) {
		t.Fatalf("after UID 2: %v", subjects(nb.Mails))
	}

	// A deleted mail's UID is not reused.
	if err := os.Remove(filepath.Join(dir, "new", "1700000200.M1P1.host")); err != nil {
		t.Fatal(err)
	}
	deliver(t, dir, "new", "1700000300.M1P1.host", mailWithSubject("four"))
	b3 := mustFetch(t, m2, 0, 0, 0)
	if got := uidsOf(b3.Mails); !slices.Equal(got, []uint32{1, 3, 4}) || b3.HighestUID != 4 {
		t.Fatalf("after a delete: UIDs %v HighestUID %d, want [1 3 4] and 4", got, b3.HighestUID)
	}
	if _, err := m2.Get(context.Background(), 2, 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Get(deleted): %v, want ErrNotFound", err)
	}
}

func TestMaildirLeavesMailAlone(t *testing.T) {
	dir := newMaildirDir(t)
	deliver(t, dir, "new", "1700000100.M1P1.host", mailWithSubject("one"))
	deliver(t, dir, "cur", "1700000200.M1P1.host:2,", mailWithSubject("two"))
	before := snapshot(t, dir)
	m, err := NewMaildir(dir)
	if err != nil {
		t.Fatal(err)
	}
	mustFetch(t, m, 0, 0, 0)
	mustFetch(t, m, 0, 0, 10)
	if _, err := m.Get(context.Background(), 1, 0); err != nil {
		t.Fatal(err)
	}
	if after := snapshot(t, dir); !maps.Equal(before, after) {
		t.Fatalf("the source changed mail files:\nbefore %v\nafter  %v", before, after)
	}
}

// snapshot maps every file under dir but the UID list to its content and
// mtime.
func snapshot(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || d.Name() == UIDListName {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		out[rel] = fmt.Sprintf("%s@%s", b, info.ModTime())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestMaildirFetchLimitsAndGet(t *testing.T) {
	dir := newMaildirDir(t)
	small := mailWithSubject("small")
	header := []byte("From: big@example.com\r\nSubject: big\r\n\r\n")
	big := append(slices.Clone(header), bytes.Repeat([]byte("x"), 4096)...)
	deliver(t, dir, "new", "1700000001.M1.host", small)
	deliver(t, dir, "new", "1700000002.M1.host", big)
	deliver(t, dir, "new", "1700000003.M1.host", mailWithSubject("third"))
	m, err := NewMaildir(dir)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name       string
		after      uint32
		limit      int
		maxBytes   int64
		want       []uint32
		headerOnly []uint32
	}{
		{"all", 0, 0, 0, []uint32{1, 2, 3}, nil},
		{"limit", 0, 2, 0, []uint32{1, 2}, nil},
		{"after", 1, 0, 0, []uint32{2, 3}, nil},
		{"after and limit", 1, 1, 0, []uint32{2}, nil},
		{"maxBytes", 0, 0, 1024, []uint32{1, 2, 3}, []uint32{2}},
		{"nothing new", 3, 0, 0, nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := mustFetch(t, m, tc.after, tc.limit, tc.maxBytes)
			if got := uidsOf(b.Mails); !slices.Equal(got, tc.want) {
				t.Fatalf("UIDs %v, want %v", got, tc.want)
			}
			for _, mail := range b.Mails {
				if ho := slices.Contains(tc.headerOnly, mail.UID); mail.HeaderOnly != ho {
					t.Errorf("UID %d HeaderOnly %v, want %v", mail.UID, mail.HeaderOnly, ho)
				}
				if mail.HeaderOnly && (!bytes.Equal(mail.Raw, header) || mail.Size != int64(len(big))) {
					t.Errorf("header-only UID %d: Raw %q Size %d", mail.UID, mail.Raw, mail.Size)
				}
			}
		})
	}
	ctx := context.Background()
	if g, err := m.Get(ctx, 1, 0); err != nil || !bytes.Equal(g.Raw, small) || g.UID != 1 {
		t.Fatalf("Get(1) = %+v, %v", g, err)
	}
	for _, uid := range []uint32{0, 4, 1 << 31} {
		if _, err := m.Get(ctx, uid, 0); !errors.Is(err, ErrNotFound) {
			t.Errorf("Get(%d): %v, want ErrNotFound", uid, err)
		}
	}
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := m.Fetch(cctx, 0, 0, 0); !errors.Is(err, context.Canceled) {
		t.Errorf("Fetch with a cancelled ctx: %v", err)
	}
}

func TestMaildirListErrorsAndEpochs(t *testing.T) {
	tests := []struct {
		name    string
		list    string
		wantErr string
	}{
		{"garbage", "hello\n", "line 1"},
		{"zero validity", "V0 N1\n", "UIDVALIDITY"},
		{"uid not below next", "V5 N3\n3 1700000000.M1.host\n", "not below the next UID"},
		{"repeated uid", "V5 N9\n1 a\n1 b\n", "repeats"},
		{"repeated file", "V5 N9\n1 a\n2 a\n", "repeats"},
		{"flags in key", "V5 N9\n1 a:2,S\n", "line 2"},
		{"empty", "", "empty file"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := newMaildirDir(t)
			if err := os.WriteFile(filepath.Join(dir, UIDListName), []byte(tc.list), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := NewMaildir(dir)
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), UIDListName) {
				t.Fatalf("NewMaildir: %v, want an error naming %s and %q", err, UIDListName, tc.wantErr)
			}
		})
	}

	t.Run("not a Maildir", func(t *testing.T) {
		if _, err := NewMaildir(t.TempDir()); err == nil || !strings.Contains(err.Error(), "cur/ and new/") {
			t.Fatalf("NewMaildir(empty dir): %v", err)
		}
	})

	t.Run("deleted list starts a new epoch", func(t *testing.T) {
		dir := newMaildirDir(t)
		deliver(t, dir, "new", "1700000001.M1.host", mailWithSubject("a"))
		m, err := NewMaildir(dir)
		if err != nil {
			t.Fatal(err)
		}
		b1 := mustFetch(t, m, 0, 0, 0)
		if err := os.Remove(filepath.Join(dir, UIDListName)); err != nil {
			t.Fatal(err)
		}
		b2 := mustFetch(t, m, 0, 0, 0)
		if b2.UIDValidity == b1.UIDValidity || !slices.Equal(uidsOf(b2.Mails), []uint32{1}) {
			t.Fatalf("after deleting the list: UIDVALIDITY %d (was %d), UIDs %v", b2.UIDValidity, b1.UIDValidity, uidsOf(b2.Mails))
		}
	})

	t.Run("an unusable list is an error, not a silent reassignment", func(t *testing.T) {
		dir := newMaildirDir(t)
		m, err := NewMaildir(dir)
		if err != nil {
			t.Fatal(err)
		}
		deliver(t, dir, "new", "1700000001.M1.host", mailWithSubject("a"))
		list := filepath.Join(dir, UIDListName)
		if err := os.Remove(list); err != nil {
			t.Fatal(err)
		}
		// A non-empty directory in its place: neither readable nor replaceable.
		if err := os.MkdirAll(filepath.Join(list, "x"), 0o755); err != nil {
			t.Fatal(err)
		}
		for _, call := range []func() error{
			func() error { _, err := m.Fetch(context.Background(), 0, 0, 0); return err },
			func() error { _, err := m.Get(context.Background(), 1, 0); return err },
		} {
			if err := call(); err == nil || !strings.Contains(err.Error(), UIDListName) {
				t.Fatalf("with the list unusable: %v, want an error naming %s", err, UIDListName)
			}
		}
		if _, err := NewMaildir(dir); err == nil {
			t.Fatal("NewMaildir with an unusable list succeeded")
		}
	})
}

func TestMaildirWait(t *testing.T) {
	dir := newMaildirDir(t)
	m, err := NewMaildir(dir)
	if err != nil {
		t.Fatal(err)
	}
	mustFetch(t, m, 0, 0, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	start := time.Now()
	if err := m.Wait(ctx, 50*time.Millisecond); err != nil || time.Since(start) < 50*time.Millisecond {
		t.Fatalf("Wait(50ms) = %v after %s", err, time.Since(start))
	}

	// d beyond the test's deadline: only the delivery can end Wait cleanly.
	done := make(chan error, 1)
	go func() { done <- m.Wait(ctx, time.Hour) }()
	deliver(t, dir, "new", "1700000001.M1.host", mailWithSubject("a"))
	if err := <-done; err != nil {
		t.Fatalf("Wait did not notice a new mail: %v", err)
	}

	cctx, ccancel := context.WithCancel(ctx)
	ccancel()
	if err := m.Wait(cctx, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait with a cancelled ctx: %v", err)
	}
}

func TestReadHeader(t *testing.T) {
	long := strings.Repeat("a", 5000)
	tests := []struct{ in, want string }{
		{"A: 1\r\nB: 2\r\n\r\nbody\r\n", "A: 1\r\nB: 2\r\n\r\n"},
		{"A: 1\nB: 2\n\nbody\n", "A: 1\nB: 2\n\n"},
		{"A: 1\r\n", "A: 1\r\n"},
		{"", ""},
		{"\r\nbody", "\r\n"},
		// A line ending exactly at the reader's buffer size is no blank line.
		{"X: " + long + "\n\nbody", "X: " + long + "\n\n"},
	}
	for _, tc := range tests {
		got, err := readHeader(strings.NewReader(tc.in))
		if err != nil || string(got) != tc.want {
			t.Errorf("readHeader(%.20q…) = %.40q, %v; want %.40q", tc.in, got, err, tc.want)
		}
	}
}

func FuzzParseUIDList(f *testing.F) {
	f.Add([]byte("V1700000000 N4\n1 1700000000.M1P1.host\n3 handmade\n"))
	f.Add([]byte("V5 N1\n"))
	f.Add([]byte("V5 N9\n1 a\n1 b\n"))
	f.Add([]byte("V4294967295 N4294967295\n4294967294 x y z\n"))
	f.Add([]byte("garbage"))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, n, uids, err := parseUIDList(data)
		if err != nil {
			return
		}
		if v == 0 || n == 0 {
			t.Fatalf("accepted validity %d next %d", v, n)
		}
		for k, u := range uids {
			if u == 0 || u >= n {
				t.Fatalf("accepted UID %d (next %d)", u, n)
			}
			if key, ok := maildirKey(k); !ok || key != k {
				t.Fatalf("accepted key %q", k)
			}
		}
		v2, n2, uids2, err := parseUIDList(formatUIDList(v, n, uids))
		if err != nil || v2 != v || n2 != n || len(uids2) != len(uids) {
			t.Fatalf("round trip: %v", err)
		}
		for k, u := range uids {
			if uids2[k] != u {
				t.Fatalf("round trip changed %q: %d → %d", k, u, uids2[k])
			}
		}
	})
}

func FuzzReadHeader(f *testing.F) {
	f.Add([]byte("A: 1\r\n\r\nbody"))
	f.Add([]byte("no header end"))
	f.Add([]byte("\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		got, err := readHeader(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.HasPrefix(data, got) || len(got) > maxHeaderBytes {
			t.Fatalf("header %q is not a bounded prefix of the input", got)
		}
	})
}

func FuzzMaildirKey(f *testing.F) {
	for _, s := range []string{"1700000000.M1P1.host:2,S", ".hidden", ":2,S", "a\nb", "123", "-5.x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		key, ok := maildirKey(name)
		if !ok {
			return
		}
		if key == "" || strings.ContainsAny(key, ":\n\r/") || key[0] == '.' || !strings.HasPrefix(name, key) {
			t.Fatalf("maildirKey(%q) = %q", name, key)
		}
		if ts, ok := deliveryTime(key); ok && ts < 0 {
			t.Fatalf("deliveryTime(%q) = %d", key, ts)
		}
	})
}
