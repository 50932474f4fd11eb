package appliancetest

import (
	"context"
	"testing"

	"gpuhost/api"
)

func TestFixtureSwitches(t *testing.T) {
	f := New(t, Options{Activate: "llama"})
	st := f.Sup.State()
	if st.Phase != api.PhaseActive || st.Profile != "llama" {
		t.Fatalf("state %+v", st)
	}
	p, err := f.Sup.AwaitActive(context.Background())
	if err != nil || p.Name != "llama" {
		t.Fatalf("AwaitActive = %v, %v", p, err)
	}
	if ls := f.Sup.LastSwitch(); ls == nil || !ls.OK || ls.Profile != "llama" {
		t.Errorf("last switch %+v", ls)
	}
}
