package backend

import (
	"strings"
	"testing"

	"gpuhost/simulator"
	"gpuhost/units"
)

func TestVLLMSleepWakeAgainstSimulator(t *testing.T) {
	for _, level := range []int{1, 2} {
		base := startSim(t, simulator.Options{Flavor: simulator.FlavorVLLM, Model: "org/m", ServedName: "m",
			DevMode: true, EnableSleepMode: true})
		ctx := testCtx(t)
		var sl Sleeper = NewVLLM(units.Profile{Name: "p", Backend: units.VLLM, Model: "org/m", ServedName: "m"}, NewClient(), base)
		if asleep, err := sl.Sleeping(ctx); err != nil || asleep {
			t.Fatalf("level %d: Sleeping before sleep = %v, %v", level, asleep, err)
		}
		if _, err := sl.Sleep(ctx, level); err != nil {
			t.Fatalf("level %d: Sleep: %v", level, err)
		}
		if asleep, err := sl.Sleeping(ctx); err != nil || !asleep {
			t.Fatalf("level %d: Sleeping after sleep = %v, %v", level, asleep, err)
		}
		msg, err := sl.Wake(ctx, level)
		if err != nil {
			t.Fatalf("level %d: Wake: %v", level, err)
		}
		if asleep, err := sl.Sleeping(ctx); err != nil || asleep {
			t.Fatalf("level %d: Sleeping after wake = %v, %v (%s)", level, asleep, err, msg)
		}
		// The model answers again: level 2 must have reloaded the weights.
		if _, err := NewVLLM(units.Profile{ServedName: "m"}, NewClient(), base).Verify(ctx); err != nil {
			t.Errorf("level %d: verify after wake: %v", level, err)
		}
	}
}

func TestVLLMSleepWithoutDevModeSaysWhy(t *testing.T) {
	base := startSim(t, simulator.Options{Flavor: simulator.FlavorVLLM, Model: "org/m", ServedName: "m"})
	_, err := NewVLLM(units.Profile{Backend: units.VLLM, Model: "org/m"}, NewClient(), base).Sleep(testCtx(t), 1)
	if err == nil || !strings.Contains(err.Error(), "404") || !strings.Contains(err.Error(), units.EnvVLLMDevMode) {
		t.Errorf("sleep without dev mode: %v, want a 404 that names %s", err, units.EnvVLLMDevMode)
	}
	if _, err := NewVLLM(units.Profile{}, NewClient(), base).Sleep(testCtx(t), 3); err == nil || !strings.Contains(err.Error(), "must be 1 or 2") {
		t.Errorf("sleep level 3: %v", err)
	}
}

func TestOllamaUnloadLoadAgainstSimulator(t *testing.T) {
	base := startSim(t, simulator.Options{Flavor: simulator.FlavorOllama, Model: "llama3.1:8b"})
	ctx := testCtx(t)
	o := NewOllama(units.Profile{Name: "llama", Backend: units.Ollama, Model: "llama3.1:8b"}, NewClient(), base)
	if _, err := o.Load(ctx); err != nil {
		t.Fatal(err)
	}
	if asleep, err := o.Sleeping(ctx); err != nil || asleep {
		t.Fatalf("Sleeping with the model loaded = %v, %v", asleep, err)
	}
	if _, err := o.Sleep(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if asleep, err := o.Sleeping(ctx); err != nil || !asleep {
		t.Fatalf("Sleeping after unload = %v, %v", asleep, err)
	}
	if _, err := o.Wake(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := o.Verify(ctx); err != nil {
		t.Errorf("verify after wake: %v", err)
	}
}
