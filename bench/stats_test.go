package bench

import (
	"math"
	"testing"
)

func near(a, b, tol float64) bool { return math.Abs(a-b) <= tol }

func TestRegIncBetaClosedForms(t *testing.T) {
	for _, c := range []struct {
		name    string
		a, b, x float64
		want    float64
	}{
		{"I_x(a,1)=x^a", 2.5, 1, 0.3, math.Pow(0.3, 2.5)},
		{"I_x(1,b)=1-(1-x)^b", 1, 3.7, 0.42, 1 - math.Pow(0.58, 3.7)},
		{"symmetric half", 7, 7, 0.5, 0.5},
		{"symmetric half, large", 400, 400, 0.5, 0.5},
		{"x=0", 2, 3, 0, 0},
		{"x=1", 2, 3, 1, 1},
		// I_x(2,2) = 3x² − 2x³
		{"I_x(2,2)", 2, 2, 0.8, 3*0.64 - 2*0.512},
	} {
		if got := RegIncBeta(c.a, c.b, c.x); !near(got, c.want, 1e-12) {
			t.Errorf("%s: RegIncBeta(%v,%v,%v) = %.15g, want %.15g", c.name, c.a, c.b, c.x, got, c.want)
		}
	}
	for _, bad := range [][3]float64{{0, 1, 0.5}, {1, -1, 0.5}, {1, 1, 1.5}, {1, 1, -0.1}, {math.NaN(), 1, 0.5}} {
		if got := RegIncBeta(bad[0], bad[1], bad[2]); !math.IsNaN(got) {
			t.Errorf("RegIncBeta%v = %v, want NaN", bad, got)
		}
	}
}

func TestStudentT(t *testing.T) {
	for _, c := range []struct {
		t, df, twoSided float64
	}{
		{1, 1, 0.5},                            // Cauchy: 1 − 2/π·atan(1)
		{2, 2, 2 * (0.5 - 2/(2*math.Sqrt(6)))}, // df 2: CDF = ½ + t/(2√(2+t²))
		{2.228138851986, 10, 0.05},             // tables: t(0.975, 10)
		{2.042272456301, 30, 0.05},             // t(0.975, 30)
		{4.032142983557, 5, 0.01},              // t(0.995, 5)
		{12.70620473617, 1, 0.05},              // t(0.975, 1)
		{1.959963984540, math.Inf(1), 0.05},
		{0, 7.3, 1},
	} {
		got := StudentTTwoSided(c.t, c.df)
		if !near(got, c.twoSided, 1e-9) {
			t.Errorf("P(|T|≥%v; df=%v) = %.12g, want %.12g", c.t, c.df, got, c.twoSided)
		}
		if got2 := StudentTTwoSided(-c.t, c.df); got2 != got {
			t.Errorf("two-sided p not symmetric at t=%v: %v vs %v", c.t, got, got2)
		}
	}
	// CDF: monotone, symmetric, fractional df between its integer neighbours.
	prev := 0.0
	for x := -8.0; x <= 8; x += 0.25 {
		c := StudentTCDF(x, 4.6)
		if c < prev-1e-15 || c < 0 || c > 1 {
			t.Fatalf("CDF not monotone in [0,1] at %v: %v after %v", x, c, prev)
		}
		if !near(c+StudentTCDF(-x, 4.6), 1, 1e-12) {
			t.Fatalf("CDF(%v)+CDF(%v) != 1", x, -x)
		}
		lo, hi := StudentTCDF(x, 4), StudentTCDF(x, 5)
		if x > 0 && !(c >= lo-1e-12 && c <= hi+1e-12) {
			t.Fatalf("CDF(%v, 4.6)=%v not between df 4 (%v) and 5 (%v)", x, c, lo, hi)
		}
		prev = c
	}
	if !math.IsNaN(StudentTTwoSided(1, 0)) || StudentTTwoSided(math.Inf(1), 3) != 0 {
		t.Error("edge cases: df 0 must be NaN, infinite t must be 0")
	}
}

func TestWelchTest(t *testing.T) {
	// Wikipedia's "Welch's t-test" example 1: t = −2.46, ν ≈ 25.0, p = 0.021.
	a := []float64{27.5, 21.0, 19.0, 23.6, 17.0, 17.9, 16.9, 20.1, 21.9, 22.6, 23.1, 19.6, 19.0, 21.7, 21.4}
	b := []float64{27.1, 22.0, 20.8, 23.4, 23.4, 23.5, 25.8, 22.0, 24.8, 20.2, 21.9, 22.1, 22.9, 20.5, 24.4}
	tt, df, p, ok := WelchTest(a, b)
	if !ok || !near(tt, -2.46, 0.005) || !near(df, 25.0, 0.05) || !near(p, 0.021, 0.0005) {
		t.Fatalf("Welch = t %.4f, df %.3f, p %.4f, ok %v; want −2.46, 25.0, 0.021", tt, df, p, ok)
	}
	if _, _, _, ok := WelchTest([]float64{1}, b); ok {
		t.Error("one sample: ok must be false")
	}
	if _, _, p, ok := WelchTest([]float64{5, 5, 5}, []float64{5, 5}); !ok || p != 1 {
		t.Errorf("identical constants: p = %v, want 1", p)
	}
	if _, _, p, ok := WelchTest([]float64{5, 5, 5}, []float64{6, 6}); !ok || p != 0 {
		t.Errorf("different constants: p = %v, want 0", p)
	}
	// One side constant: the other's variance alone decides.
	if _, _, p, ok := WelchTest([]float64{10, 10, 10}, []float64{9, 11, 10, 10.5}); !ok || p < 0.05 {
		t.Errorf("constant vs noisy sample with the same mean: p = %v, want ≥ 0.05", p)
	}
}

func TestPercentileAndDist(t *testing.T) {
	xs := []float64{15, 20, 35, 40, 50}
	for _, c := range []struct{ p, want float64 }{{0, 15}, {50, 35}, {40, 29}, {100, 50}, {90, 46}, {99, 49.6}} {
		if got := Percentile(xs, c.p); !near(got, c.want, 1e-9) {
			t.Errorf("Percentile(%v) = %v, want %v (numpy linear)", c.p, got, c.want)
		}
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("empty percentile must be NaN")
	}
	d := NewDist([]float64{4, 1, 3, 2})
	if d.Mean != 2.5 || d.P50 != 2.5 || d.N != 4 {
		t.Errorf("NewDist = %+v", d)
	}
	m, sd := MeanStddev([]float64{2, 4, 4, 4, 5, 5, 7, 9})
	if m != 5 || !near(sd, 2.138089935, 1e-9) {
		t.Errorf("MeanStddev = %v, %v; want 5, 2.1381 (sample)", m, sd)
	}
	s := NewStat([]float64{1, math.NaN(), 3, math.Inf(1)})
	if s.N != 2 || s.Mean != 2 {
		t.Errorf("NewStat must drop NaN/Inf: %+v", s)
	}
}

func TestStudentTQuantile(t *testing.T) {
	for _, c := range []struct{ q, df, want float64 }{
		{0.975, 1, 12.7062}, {0.975, 10, 2.2281}, {0.995, 4, 4.6041}, {0.975, math.Inf(1), 1.95996}, {0.025, 10, -2.2281}, {0.5, 3, 0},
	} {
		if got := StudentTQuantile(c.q, c.df); math.Abs(got-c.want) > 1e-3 {
			t.Errorf("StudentTQuantile(%v, %v) = %v, want %v", c.q, c.df, got, c.want)
		}
	}
	if !math.IsNaN(StudentTQuantile(1, 3)) || !math.IsNaN(StudentTQuantile(0.9, 0)) {
		t.Error("invalid arguments do not give NaN")
	}
}
