package benchcmd

import (
	"testing"

	"gpuhost/internal/exitclass"
	"gpuhost/simulator"
	"gpuhost/simulator/simtest"
)

// startSim runs the real simulator in-process (simtest.Start).
func startSim(t testing.TB, o simulator.Options) string { return simtest.Start(t, o) }

// exitOf is the process status err would end `gpuhost bench` with.
func exitOf(err error) int { return int(exitclass.Of(err)) }
