// Package benchcmd is the command `gpuhost bench` (run, switch, capacity,
// list, show, compare): flags, the terminal progress bar, errors that
// carry their exit class (internal/exitclass) and storing a result locally or in the
// daemon's store. What it measures, stores and prints is gpuhost/bench;
// this package only adds the command line, so that the core links no
// cobra, pflag or terminal library.
//
// Wiring (package main):
//
//	root.AddCommand(benchcmd.NewCmd(benchcmd.Deps{GpuhostVersion: version, GpuhostCommit: commit, Env: …, Daemon: …}))
package benchcmd
