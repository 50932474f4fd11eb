package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// selfCommand is how the user can run this binary again from where they
// are, for the commands gpuhost prints: "gpuhost" when that name on $PATH
// is this binary, else the path relative to the working directory
// ("./bin/gpuhost" after `make demo`), else the absolute path. A printed
// command that is pasted must run, not answer "command not found".
func selfCommand() string {
	exe, err := os.Executable()
	if err != nil {
		return "gpuhost"
	}
	if onPath, err := exec.LookPath("gpuhost"); err == nil && sameFile(onPath, exe) {
		return "gpuhost"
	}
	if wd, err := os.Getwd(); err == nil {
		if rel, err := filepath.Rel(wd, exe); err == nil && !strings.HasPrefix(rel, "..") {
			return "./" + rel
		}
	}
	return exe
}

func sameFile(a, b string) bool {
	ia, err := os.Stat(a)
	if err != nil {
		return false
	}
	ib, err := os.Stat(b)
	return err == nil && os.SameFile(ia, ib)
}
