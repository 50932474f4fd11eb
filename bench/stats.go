package bench

import (
	"math"
	"slices"
)

// Stat is one figure measured once per repeat: the raw samples are kept so
// that a later compare can test significance across repeats, not just look
// at two means.
type Stat struct {
	Samples []float64 `json:"samples"`
	// Mean and Stddev (sample standard deviation, n−1) summarise Samples;
	// Stddev is 0 for fewer than two samples.
	Mean   float64 `json:"mean"`
	Stddev float64 `json:"stddev"`
	N      int     `json:"n"`
}

// NewStat summarises samples; NaN and infinite values (a division by a zero
// duration, say) are dropped so that one bad sample cannot poison a mean.
func NewStat(samples []float64) Stat {
	clean := make([]float64, 0, len(samples))
	for _, v := range samples {
		if !math.IsNaN(v) && !math.IsInf(v, 0) {
			clean = append(clean, v)
		}
	}
	m, sd := MeanStddev(clean)
	return Stat{Samples: clean, Mean: m, Stddev: sd, N: len(clean)}
}

// MeanStddev returns the mean and the sample standard deviation (n−1 in the
// denominator, as benchstat and vLLM report spread across runs); the
// deviation is 0 for fewer than two values and both are 0 for none.
func MeanStddev(xs []float64) (mean, stddev float64) {
	if len(xs) == 0 {
		return 0, 0
	}
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	if len(xs) < 2 {
		return mean, 0
	}
	var ss float64
	for _, x := range xs {
		d := x - mean
		ss += d * d
	}
	return mean, math.Sqrt(ss / float64(len(xs)-1))
}

// Percentile returns the p-th percentile (0–100) of xs with linear
// interpolation between closest ranks, the definition numpy.percentile uses
// by default and therefore the one vLLM's bench serve reports. xs need not
// be sorted; an empty input gives NaN.
func Percentile(xs []float64, p float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	return percentileSorted(s, p)
}

func percentileSorted(s []float64, p float64) float64 {
	if len(s) == 0 {
		return math.NaN()
	}
	p = math.Max(0, math.Min(100, p))
	rank := p / 100 * float64(len(s)-1)
	lo := int(math.Floor(rank))
	hi := int(math.Ceil(rank))
	if lo == hi {
		return s[lo]
	}
	return s[lo] + (s[hi]-s[lo])*(rank-float64(lo))
}

// Dist is a latency distribution of one repeat: mean and percentiles in
// milliseconds, as vLLM's bench serve prints them.
type Dist struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	N    int     `json:"n"`
}

// NewDist summarises latencies; empty input gives NaN fields and N 0.
func NewDist(xs []float64) Dist {
	if len(xs) == 0 {
		nan := math.NaN()
		return Dist{Mean: nan, P50: nan, P90: nan, P99: nan}
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	m, _ := MeanStddev(s)
	return Dist{Mean: m, P50: percentileSorted(s, 50), P90: percentileSorted(s, 90), P99: percentileSorted(s, 99), N: len(s)}
}

// WelchTest is Welch's unequal-variances t-test of two samples: the t
// statistic, the Welch–Satterthwaite degrees of freedom and the two-sided p
// value. ok is false when a side has fewer than two samples, where no
// variance can be estimated and no verdict is possible.
//
// Two samples without any spread give p = 0 when their means differ and
// p = 1 when they are equal: with no noise, any difference is real.
func WelchTest(a, b []float64) (t, df, p float64, ok bool) {
	if len(a) < 2 || len(b) < 2 {
		return math.NaN(), math.NaN(), math.NaN(), false
	}
	ma, sa := MeanStddev(a)
	mb, sb := MeanStddev(b)
	va := sa * sa / float64(len(a))
	vb := sb * sb / float64(len(b))
	se2 := va + vb
	if se2 == 0 {
		if ma == mb {
			return 0, math.Inf(1), 1, true
		}
		return math.Copysign(math.Inf(1), ma-mb), math.Inf(1), 0, true
	}
	t = (ma - mb) / math.Sqrt(se2)
	den := 0.0
	if va > 0 {
		den += va * va / float64(len(a)-1)
	}
	if vb > 0 {
		den += vb * vb / float64(len(b)-1)
	}
	df = se2 * se2 / den
	return t, df, StudentTTwoSided(t, df), true
}

// StudentTTwoSided is P(|T| ≥ |t|) for Student's t distribution with df
// degrees of freedom (df may be fractional, as Welch's test gives):
// I_{df/(df+t²)}(df/2, 1/2), the regularized incomplete beta function.
func StudentTTwoSided(t, df float64) float64 {
	switch {
	case math.IsNaN(t) || math.IsNaN(df) || df <= 0:
		return math.NaN()
	case math.IsInf(t, 0):
		return 0
	case math.IsInf(df, 1): // the normal limit
		return math.Erfc(math.Abs(t) / math.Sqrt2)
	}
	x := df / (df + t*t)
	return RegIncBeta(df/2, 0.5, x)
}

// StudentTCDF is P(T ≤ t) for Student's t distribution with df degrees of
// freedom.
func StudentTCDF(t, df float64) float64 {
	p := StudentTTwoSided(t, df) / 2
	if t > 0 {
		return 1 - p
	}
	return p
}

// RegIncBeta is the regularized incomplete beta function I_x(a, b) for
// a, b > 0 and 0 ≤ x ≤ 1, evaluated with the continued fraction of
// Numerical Recipes (modified Lentz), using the symmetry
// I_x(a,b) = 1 − I_{1−x}(b,a) where the fraction converges faster. Invalid
// arguments give NaN.
func RegIncBeta(a, b, x float64) float64 {
	switch {
	case math.IsNaN(a) || math.IsNaN(b) || math.IsNaN(x) || a <= 0 || b <= 0 || x < 0 || x > 1:
		return math.NaN()
	case x == 0:
		return 0
	case x == 1:
		return 1
	}
	la, _ := math.Lgamma(a + b)
	lb, _ := math.Lgamma(a)
	lc, _ := math.Lgamma(b)
	front := math.Exp(la - lb - lc + a*math.Log(x) + b*math.Log1p(-x))
	if x < (a+1)/(a+b+2) {
		return front * betaCF(a, b, x) / a
	}
	return 1 - front*betaCF(b, a, 1-x)/b
}

// betaCF evaluates the continued fraction of the incomplete beta function.
func betaCF(a, b, x float64) float64 {
	const (
		maxIter = 300
		eps     = 1e-15
		tiny    = 1e-300
	)
	qab, qap, qam := a+b, a+1, a-1
	c, d := 1.0, 1-qab*x/qap
	if math.Abs(d) < tiny {
		d = tiny
	}
	d = 1 / d
	h := d
	for m := 1; m <= maxIter; m++ {
		fm := float64(m)
		m2 := 2 * fm
		aa := fm * (b - fm) * x / ((qam + m2) * (a + m2))
		d = 1 + aa*d
		if math.Abs(d) < tiny {
			d = tiny
		}
		c = 1 + aa/c
		if math.Abs(c) < tiny {
			c = tiny
		}
		d = 1 / d
		h *= d * c
		aa = -(a + fm) * (qab + fm) * x / ((a + m2) * (qap + m2))
		d = 1 + aa*d
		if math.Abs(d) < tiny {
			d = tiny
		}
		c = 1 + aa/c
		if math.Abs(c) < tiny {
			c = tiny
		}
		d = 1 / d
		del := d * c
		h *= del
		if math.Abs(del-1) < eps {
			break
		}
	}
	return h
}

// StudentTQuantile is the q-quantile (0 < q < 1) of Student's t
// distribution with df degrees of freedom, found by bisection on
// StudentTCDF; invalid arguments give NaN.
func StudentTQuantile(q, df float64) float64 {
	if math.IsNaN(q) || math.IsNaN(df) || q <= 0 || q >= 1 || df <= 0 {
		return math.NaN()
	}
	if q == 0.5 {
		return 0
	}
	if q < 0.5 {
		return -StudentTQuantile(1-q, df)
	}
	lo, hi := 0.0, 1.0
	for StudentTCDF(hi, df) < q {
		lo, hi = hi, hi*2
		if hi > 1e12 {
			return math.Inf(1)
		}
	}
	for range 200 {
		mid := (lo + hi) / 2
		if StudentTCDF(mid, df) < q {
			lo = mid
		} else {
			hi = mid
		}
		if hi-lo <= 1e-12*hi {
			break
		}
	}
	return (lo + hi) / 2
}
