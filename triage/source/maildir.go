package source

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"gpuhost/internal/atomicfile"
)

// UIDListName is the file in the Maildir's root where the Maildir source
// keeps its UID assignments. Maildir itself has no UIDs; the worker's
// checkpoint needs them to mean the same after a restart.
const UIDListName = ".gpuhost-uidlist"

// maxHeaderBytes bounds the header block read for a HeaderOnly mail.
const maxHeaderBytes = 1 << 20

// maildirPoll is how often Wait looks at new/ and cur/ for a change.
const maildirPoll = time.Second

// Maildir reads a Maildir folder (cur/, new/, tmp/) without changing its
// mail files: nothing is moved, renamed or flagged. UIDs are assigned in
// delivery order (the timestamp that starts a Maildir file name, then the
// name) and kept in UIDListName, so they survive restarts and a mail keeps
// its UID when a mail client moves it from new/ to cur/ and appends flags
// (":2,S"). The list's UIDVALIDITY is the creation time; deleting the list
// starts a new UID epoch, which the worker handles like an IMAP
// UIDVALIDITY change. One process should read a Maildir at a time.
type Maildir struct {
	dir      string
	name     string
	listPath string

	mu       sync.Mutex
	validity uint32
	next     uint32            // the UID the next new file gets
	uids     map[string]uint32 // file key (name before ':') → UID
	paths    map[uint32]string // UID → path at the last scan
	listStat fileStamp         // the list as last read or written
	dirStat  [2]fileStamp      // new/ and cur/ at the last scan, for Wait
}

// fileStamp is enough of a stat to notice a change.
type fileStamp struct {
	mod  time.Time
	size int64
}

func stamp(path string) fileStamp {
	st, err := os.Stat(path)
	if err != nil {
		return fileStamp{}
	}
	return fileStamp{st.ModTime(), st.Size()}
}

// NewMaildir opens dir (which must have cur/ and new/) and loads or creates
// its UID list.
func NewMaildir(dir string) (*Maildir, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("maildir %s: %w", dir, err)
	}
	for _, sub := range []string{"cur", "new"} {
		st, err := os.Stat(filepath.Join(abs, sub))
		if err != nil {
			return nil, fmt.Errorf("maildir %s: not a Maildir folder (needs cur/ and new/): %w", abs, err)
		}
		if !st.IsDir() {
			return nil, fmt.Errorf("maildir %s: %s is not a directory", abs, sub)
		}
	}
	m := &Maildir{
		dir:      abs,
		name:     "maildir:" + abs,
		listPath: filepath.Join(abs, UIDListName),
	}
	if err := m.loadList(); err != nil {
		return nil, err
	}
	if m.validity == 0 {
		if err := m.newEpoch(0); err != nil {
			return nil, err
		}
	}
	m.dirStat = m.dirStamps()
	return m, nil
}

// newEpoch starts an empty UID list whose UIDVALIDITY (the time) differs
// from old.
func (m *Maildir) newEpoch(old uint32) error {
	validity := uint32(time.Now().Unix())
	if validity == old {
		validity++
	}
	if err := m.writeList(validity, 1, map[string]uint32{}); err != nil {
		return err
	}
	m.validity, m.next, m.uids, m.paths = validity, 1, map[string]uint32{}, nil
	return nil
}

// Name is "maildir:<absolute dir>".
func (m *Maildir) Name() string { return m.name }

// Close releases nothing; a Maildir holds no connection.
func (m *Maildir) Close() error { return nil }

// Fetch returns up to limit mails with UID > after, ascending; mails larger
// than maxBytes come as their header block only. limit <= 0 means no limit,
// maxBytes <= 0 no size limit.
func (m *Maildir) Fetch(ctx context.Context, after uint32, limit int, maxBytes int64) (Batch, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.scan(); err != nil {
		return Batch{}, err
	}
	var uids []uint32
	for uid := range m.paths {
		if uid > after {
			uids = append(uids, uid)
		}
	}
	slices.Sort(uids)
	if limit > 0 && len(uids) > limit {
		uids = uids[:limit]
	}
	b := Batch{UIDValidity: m.validity, HighestUID: m.next - 1}
	for _, uid := range uids {
		if err := ctx.Err(); err != nil {
			return Batch{}, fmt.Errorf("%s: %w", m.name, err)
		}
		mail, err := m.read(uid, maxBytes)
		if errors.Is(err, ErrNotFound) {
			continue // deleted since the scan
		}
		if err != nil {
			return Batch{}, err
		}
		b.Mails = append(b.Mails, mail)
	}
	return b, nil
}

// Get reads one mail by UID; ErrNotFound when no file has it.
func (m *Maildir) Get(ctx context.Context, uid uint32, maxBytes int64) (Mail, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := ctx.Err(); err != nil {
		return Mail{}, fmt.Errorf("%s: %w", m.name, err)
	}
	if err := m.scan(); err != nil {
		return Mail{}, err
	}
	return m.read(uid, maxBytes)
}

// Wait returns after d, or earlier when new/ or cur/ changed since the
// last Fetch (checked every second), or when ctx ends (ctx.Err()).
func (m *Maildir) Wait(ctx context.Context, d time.Duration) error {
	timer := time.NewTimer(d)
	defer timer.Stop()
	tick := time.NewTicker(min(maildirPoll, max(d, time.Millisecond)))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-timer.C:
			return nil
		case <-tick.C:
			m.mu.Lock()
			seen := m.dirStat
			m.mu.Unlock()
			if m.dirStamps() != seen {
				return nil
			}
		}
	}
}

func (m *Maildir) dirStamps() [2]fileStamp {
	return [2]fileStamp{stamp(filepath.Join(m.dir, "new")), stamp(filepath.Join(m.dir, "cur"))}
}

// read returns the mail with uid from the path the last scan found; a file
// moved since (new/ → cur/) is found again by its key.
func (m *Maildir) read(uid uint32, maxBytes int64) (Mail, error) {
	path, ok := m.paths[uid]
	if !ok {
		return Mail{}, fmt.Errorf("%s: UID %d: %w", m.name, uid, ErrNotFound)
	}
	mail, err := readMailFile(path, maxBytes)
	if errors.Is(err, fs.ErrNotExist) {
		if err := m.scan(); err != nil {
			return Mail{}, err
		}
		if path, ok = m.paths[uid]; !ok {
			return Mail{}, fmt.Errorf("%s: UID %d (deleted): %w", m.name, uid, ErrNotFound)
		}
		mail, err = readMailFile(path, maxBytes)
	}
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return Mail{}, fmt.Errorf("%s: UID %d (deleted): %w", m.name, uid, ErrNotFound)
		}
		return Mail{}, fmt.Errorf("%s: UID %d: %w", m.name, uid, err)
	}
	mail.UID = uid
	return mail, nil
}

// readMailFile reads the whole file, or its header block when it is larger
// than maxBytes.
func readMailFile(path string, maxBytes int64) (Mail, error) {
	f, err := os.Open(path)
	if err != nil {
		return Mail{}, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Mail{}, fmt.Errorf("stat %s: %w", path, err)
	}
	mail := Mail{Size: st.Size()}
	if maxBytes > 0 && st.Size() > maxBytes {
		mail.HeaderOnly = true
		mail.Raw, err = readHeader(f)
	} else {
		mail.Raw, err = io.ReadAll(f)
	}
	if err != nil {
		return Mail{}, fmt.Errorf("read %s: %w", path, err)
	}
	return mail, nil
}

// readHeader returns the header block including the empty line that ends
// it (as IMAP's BODY[HEADER] does), at most maxHeaderBytes.
func readHeader(r io.Reader) ([]byte, error) {
	br := bufio.NewReader(io.LimitReader(r, maxHeaderBytes))
	var out []byte
	continued := false // the last read ended inside a long line
	for {
		line, err := br.ReadSlice('\n')
		out = append(out, line...)
		if !continued && len(line) > 0 && line[len(line)-1] == '\n' && len(bytes.TrimRight(line, "\r\n")) == 0 {
			return out, nil
		}
		continued = errors.Is(err, bufio.ErrBufferFull)
		switch {
		case err == nil, continued:
		case errors.Is(err, io.EOF):
			return out, nil // header without body, or cut at maxHeaderBytes
		default:
			return nil, err
		}
	}
}

// scan lists new/ and cur/, gives new files UIDs and forgets vanished ones,
// and persists the list when it changed. On a write error nothing changes
// in memory either, so no UID is handed out that a restart would not know.
func (m *Maildir) scan() error {
	if st := stamp(m.listPath); st != m.listStat {
		// Rewritten by someone else (another gpuhost, an operator).
		old := m.validity
		if err := m.loadList(); err != nil {
			return err
		}
		if m.validity == 0 { // deleted: a new UID epoch
			if err := m.newEpoch(old); err != nil {
				return err
			}
		}
	}
	dirStat := m.dirStamps() // before reading, so a change during the scan shows next time
	type file struct {
		key, path string
		stamp     int64
	}
	found := map[string]file{}
	for _, sub := range []string{"new", "cur"} { // cur/ last: it wins for a key in both
		entries, err := os.ReadDir(filepath.Join(m.dir, sub))
		if err != nil {
			return fmt.Errorf("%s: list %s/: %w", m.name, sub, err)
		}
		for _, e := range entries {
			key, ok := maildirKey(e.Name())
			if !ok || !e.Type().IsRegular() {
				continue
			}
			f := file{key: key, path: filepath.Join(m.dir, sub, e.Name())}
			if ts, ok := deliveryTime(key); ok {
				f.stamp = ts
			} else if info, err := e.Info(); err == nil {
				f.stamp = info.ModTime().Unix()
			}
			found[key] = f
		}
	}

	uids := make(map[string]uint32, len(found))
	paths := make(map[uint32]string, len(found))
	changed := false
	var fresh []file
	for key, f := range found {
		if uid, ok := m.uids[key]; ok {
			uids[key] = uid
			paths[uid] = f.path
		} else {
			fresh = append(fresh, f)
		}
	}
	if len(uids) != len(m.uids) {
		changed = true // files deleted
	}
	slices.SortFunc(fresh, func(a, b file) int {
		return cmp.Or(cmp.Compare(a.stamp, b.stamp), strings.Compare(a.key, b.key))
	})
	next := m.next
	for _, f := range fresh {
		if next == 0 { // wrapped past 2^32-1
			return fmt.Errorf("%s: UIDs exhausted; delete %s to start a new UID epoch", m.name, m.listPath)
		}
		uids[f.key] = next
		paths[next] = f.path
		next++
		changed = true
	}
	if changed {
		if err := m.writeList(m.validity, next, uids); err != nil {
			return err
		}
	}
	m.uids, m.paths, m.next, m.dirStat = uids, paths, next, dirStat
	return nil
}

// maildirKey is the part of a Maildir file name that stays when a mail
// client adds flags (":2,FS"). Dotfiles, empty names and names with line
// breaks (which the list cannot hold) are not mail.
func maildirKey(name string) (string, bool) {
	if name == "" || name[0] == '.' || strings.ContainsAny(name, "\n\r/") {
		return "", false
	}
	key, _, _ := strings.Cut(name, ":")
	if key == "" {
		return "", false
	}
	return key, true
}

// deliveryTime is the Unix time that starts a Maildir name
// ("1700000000.M1P2.host").
func deliveryTime(key string) (int64, bool) {
	ts, _, _ := strings.Cut(key, ".")
	n, err := strconv.ParseInt(ts, 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// loadList reads the UID list; a missing one leaves validity 0.
func (m *Maildir) loadList() error {
	data, err := os.ReadFile(m.listPath)
	if errors.Is(err, fs.ErrNotExist) {
		m.validity = 0
		return nil
	}
	if err != nil {
		return fmt.Errorf("%s: read %s: %w", m.name, m.listPath, err)
	}
	validity, next, uids, err := parseUIDList(data)
	if err != nil {
		return fmt.Errorf("%s: %s (fix or delete it to start a new UID epoch): %w", m.name, m.listPath, err)
	}
	m.validity, m.next, m.uids = validity, next, uids
	m.listStat = stamp(m.listPath)
	return nil
}

func (m *Maildir) writeList(validity, next uint32, uids map[string]uint32) error {
	if err := atomicfile.Write(m.listPath, formatUIDList(validity, next, uids), 0o600); err != nil {
		return fmt.Errorf("%s: save UID list: %w", m.name, err)
	}
	m.listStat = stamp(m.listPath)
	return nil
}

// formatUIDList writes "V<uidvalidity> N<next uid>" and then "<uid> <key>"
// lines in UID order.
func formatUIDList(validity, next uint32, uids map[string]uint32) []byte {
	type entry struct {
		uid uint32
		key string
	}
	entries := make([]entry, 0, len(uids))
	for k, u := range uids {
		entries = append(entries, entry{u, k})
	}
	slices.SortFunc(entries, func(a, b entry) int { return cmp.Compare(a.uid, b.uid) })
	var b bytes.Buffer
	fmt.Fprintf(&b, "V%d N%d\n", validity, next)
	for _, e := range entries {
		fmt.Fprintf(&b, "%d %s\n", e.uid, e.key)
	}
	return b.Bytes()
}

// parseUIDList reads formatUIDList's output and refuses anything that
// could hand out a UID twice.
func parseUIDList(data []byte) (validity, next uint32, uids map[string]uint32, err error) {
	lines := strings.Split(string(data), "\n")
	if len(lines) > 0 && lines[len(lines)-1] == "" {
		lines = lines[:len(lines)-1]
	}
	if len(lines) == 0 {
		return 0, 0, nil, errors.New("empty file")
	}
	var v, n uint64
	head := strings.Fields(lines[0])
	if len(head) != 2 || !strings.HasPrefix(head[0], "V") || !strings.HasPrefix(head[1], "N") {
		return 0, 0, nil, fmt.Errorf("line 1: %q is not \"V<uidvalidity> N<next uid>\"", lines[0])
	}
	if v, err = strconv.ParseUint(head[0][1:], 10, 32); err != nil || v == 0 {
		return 0, 0, nil, fmt.Errorf("line 1: UIDVALIDITY %q is not a number in 1..2^32-1", head[0][1:])
	}
	if n, err = strconv.ParseUint(head[1][1:], 10, 32); err != nil || n == 0 {
		return 0, 0, nil, fmt.Errorf("line 1: next UID %q is not a number in 1..2^32-1", head[1][1:])
	}
	uids = make(map[string]uint32, len(lines)-1)
	seen := make(map[uint32]bool, len(lines)-1)
	for i, line := range lines[1:] {
		num, key, ok := strings.Cut(line, " ")
		u, perr := strconv.ParseUint(num, 10, 32)
		if k, kok := maildirKey(key); !ok || perr != nil || u == 0 || !kok || k != key {
			return 0, 0, nil, fmt.Errorf("line %d: %q is not \"<uid> <file name>\"", i+2, line)
		}
		if u >= n {
			return 0, 0, nil, fmt.Errorf("line %d: UID %d is not below the next UID %d", i+2, u, n)
		}
		if _, dup := uids[key]; dup || seen[uint32(u)] {
			return 0, 0, nil, fmt.Errorf("line %d: %q repeats a file or UID", i+2, line)
		}
		uids[key] = uint32(u)
		seen[uint32(u)] = true
	}
	return uint32(v), uint32(n), uids, nil
}
