package benchcmd

import (
	"testing"

	"gpuhost/simulator"
	"gpuhost/simulator/simtest"
)

// startSim runs the real simulator in-process (simtest.Start).
func startSim(t testing.TB, o simulator.Options) string { return simtest.Start(t, o) }
