// Command buildollama builds (or finds) the cached Ollama binary that the
// real-Ollama tests use, and prints its path. CI runs it before `go test`
// so that a cold build (minutes) is not charged to any test's timeout:
//
//	go run ./bench/ollamatest/buildollama
//
// It exits 2 when a prerequisite is missing (compiler, nlohmann-json3-dev,
// libstb-dev, module proxy) and 1 when the build itself fails.
package main

import (
	"fmt"
	"os"
	"time"

	"gpuhost/bench/ollamatest"
)

func main() {
	t0 := time.Now()
	// Progress on stderr: a cold build takes minutes, a loaded machine's
	// many more, and CI should not sit silent meanwhile.
	path, skip, err := ollamatest.EnsureProgress(os.Stderr)
	if err != nil {
		fmt.Fprintf(os.Stderr, "buildollama: %v\n", err)
		if skip {
			os.Exit(2)
		}
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "ollama %s ready in %s\n", ollamatest.Version, time.Since(t0).Round(time.Second))
	fmt.Println(path)
}
