package appliance

import "testing"

func TestOwnProcessesMessage(t *testing.T) {
	for n, want := range map[int]string{
		0: "no GPU processes",
		1: "1 GPU process, in the active backend unit",
		2: "2 GPU processes, all in the active backend unit",
	} {
		if got := ownProcessesMessage(n); got != want {
			t.Errorf("ownProcessesMessage(%d) = %q, want %q", n, got, want)
		}
	}
}
