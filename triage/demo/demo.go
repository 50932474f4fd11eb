// Package demo holds the sample mailbox of `gpuhost demo`: six mails that
// walk the whole triage pipeline (a customer inquiry, a newsletter with
// List-Unsubscribe, one without it, an internal mail, a mail to the
// priority mailbox and one with an MP3 voice memo).
package demo

import (
	"embed"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"

	"gpuhost/internal/atomicfile"
)

//go:embed mails/*.eml
var mails embed.FS

// Mails returns the sample mails by file name, in delivery order.
func Mails() (names []string, raw [][]byte, err error) {
	ents, err := fs.ReadDir(mails, "mails")
	if err != nil {
		return nil, nil, fmt.Errorf("read embedded demo mails: %w", err)
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].Name() < ents[j].Name() })
	for _, e := range ents {
		b, err := mails.ReadFile("mails/" + e.Name())
		if err != nil {
			return nil, nil, fmt.Errorf("read embedded demo mail %s: %w", e.Name(), err)
		}
		names = append(names, e.Name())
		raw = append(raw, b)
	}
	return names, raw, nil
}

// Seed creates the demo Maildir at dir (cur/, new/, tmp/ and the six mails
// in new/) unless dir already exists, so a restarted demo keeps its
// checkpoint and does not see the same mails as new ones again.
func Seed(dir string) (created bool, err error) {
	if _, err := os.Stat(dir); err == nil {
		return false, nil
	}
	names, raw, err := Mails()
	if err != nil {
		return false, err
	}
	for _, sub := range []string{"tmp", "cur", "new"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return false, fmt.Errorf("create demo maildir %s: %w", dir, err)
		}
	}
	// Maildir names start with the delivery time; fixed, increasing times
	// keep the sample order.
	const base = 1796025600 // 2026-11-30T08:00:00Z
	for i, name := range names {
		file := filepath.Join(dir, "new", fmt.Sprintf("%d.M%dP1.gpuhost-demo", base+i*60, i+1))
		if err := atomicfile.Write(file, raw[i], 0o600); err != nil {
			return false, fmt.Errorf("write demo mail %s: %w", name, err)
		}
	}
	return true, nil
}
