package bench

import (
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// BenchmarkStoreList: 50 results of ~4 MB (the largest an upload may be),
// then 4 concurrent Lists (what 4 concurrent GET /bench do). "every-file"
// is the store before this bound (nothing kept, no retention: every List
// parses every file whole); "retained-cold" is a fresh daemon after
// retention (bench.max_bytes 64 MiB) with nothing parsed yet; "retained-warm"
// the same once listed. Compare B/op and ns/op side by side:
//
//	go test ./bench -run '^$' -bench StoreList -benchmem -benchtime 3x
func BenchmarkStoreList(b *testing.B) {
	src := b.TempDir()
	uploads(b, &Store{Dir: src, Log: slog.New(slog.DiscardHandler)}, 50)
	kept := b.TempDir()
	uploads(b, &Store{Dir: kept, Log: slog.New(slog.DiscardHandler), MaxResults: 1000, MaxBytes: 64 << 20}, 50)
	files := func(dir string) int { es, _ := os.ReadDir(dir); return len(es) }
	b.Logf("stored: %d files without retention, %d with", files(src), files(kept))
	warm := &Store{Dir: kept, Log: slog.New(slog.DiscardHandler)}
	if _, _, err := warm.List(); err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		store func() [4]*Store
	}{
		{"every-file", func() (s [4]*Store) { // before: each List parsed everything
			for i := range s {
				s[i] = &Store{Dir: src, Log: slog.New(slog.DiscardHandler)}
			}
			return s
		}},
		{"retained-cold", func() (s [4]*Store) {
			one := &Store{Dir: kept, Log: slog.New(slog.DiscardHandler)}
			return [4]*Store{one, one, one, one}
		}},
		{"retained-warm", func() [4]*Store { return [4]*Store{warm, warm, warm, warm} }},
	} {
		b.Run(tc.name, func(b *testing.B) {
			b.ReportAllocs()
			for range b.N {
				stores := tc.store()
				var wg sync.WaitGroup
				for _, s := range stores {
					wg.Go(func() {
						if _, _, err := s.List(); err != nil {
							b.Error(err)
						}
					})
				}
				wg.Wait()
			}
		})
	}
}

// uploads saves n results of ~4 MB each, one second apart.
func uploads(b *testing.B, s *Store, n int) {
	b.Helper()
	t0 := time.Date(2026, 1, 2, 15, 4, 5, 0, time.UTC)
	note := strings.Repeat("padding ", (4<<20)/8/4)
	for i := range n {
		at := t0.Add(time.Duration(i) * time.Second)
		r := testResult(NewID(at, "upload"), at)
		r.Notes = []string{note, note, note, note}
		if _, err := s.Save(r); err != nil {
			b.Fatal(err)
		}
	}
}
