package triage

import (
	"math"
	"testing"
)

func TestFormatMoney(t *testing.T) {
	tests := []struct {
		v        float64
		currency string
		want     string
	}{
		{1.44e-05, "EUR", "0.000014 EUR"},
		{0.0021, "USD", "0.0021 USD"},
		{0.00206, "EUR", "0.0021 EUR"},
		{0.002, "USD", "0.002 USD"},
		{0.2, "EUR", "0.20 EUR"},
		{0.12345, "EUR", "0.12 EUR"},
		{0.99996, "EUR", "1.00 EUR"},
		{1.25, "EUR", "1.25 EUR"},
		{1234.5678, "USD", "1234.57 USD"},
		{0, "EUR", "0.00 EUR"},
		{-0.0005, "EUR", "-0.0005 EUR"},
		{0.0021, "", "0.0021"},
		{math.NaN(), "EUR", "NaN EUR"},
	}
	for _, tt := range tests {
		if got := FormatMoney(tt.v, tt.currency); got != tt.want {
			t.Errorf("FormatMoney(%v, %q) = %q, want %q", tt.v, tt.currency, got, tt.want)
		}
	}
	if f := (Cost{Currency: "EUR", Total: 1.44e-05}).Footer(); f != "0.000014 EUR" {
		t.Errorf("footer %q", f)
	}
}
