package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
)

// words are common five-letter English words. Each is a single token in
// the byte-pair vocabularies of current models (with its leading space)
// and the same number of characters in character-level ones, so a prompt
// built from them has the same length whichever words are drawn — which is
// what lets a calibrated length hold for every random prefix.
var words = strings.Fields(`
about above actor acute admit adopt adult after again agent agree ahead alarm album alert alike alive allow alone along
alter among anger angle angry apart apple apply arena argue arise array aside asset audio audit avoid award aware badly
baker basic beach began begin being below bench birth black blame blind block blood board boost booth bound brain brand
bread break breed brief bring broad broke brown build built buyer cable carry catch cause chain chair chart chase cheap
check chest chief child china chose civil claim class clean clear click clock close coach coast could count court cover
craft crash cream crime cross crowd crown curve cycle daily dance dated dealt death debut delay depth doing doubt dozen
draft drama drawn dream dress drink drive drove dying eager early earth eight elite empty enemy enjoy enter entry equal
error event every exact exist extra faith false fault fiber field fifth fifty fight final first fixed flash fleet floor
fluid focus force forth forty forum found frame frank fraud fresh front fruit fully funny giant given glass globe going
grace grade grand grant grass great green gross group grown guard guess guest guide happy heart heavy hence horse hotel
house human ideal image index inner input issue joint judge known label large laser later laugh layer learn lease least
leave legal level light limit local logic loose lower lucky lunch major maker march match mayor meant media metal might
minor minus mixed model money month moral motor mount mouse mouth movie music needs never newly night noise north noted
novel nurse occur ocean offer often order other outer owner panel paper party peace phase phone photo piece pilot pitch
place plain plane plant plate point pound power press price pride prime print prior prize proof proud prove queen quick
quiet quite radio raise range rapid ratio reach ready refer right rival river rough round route royal rural scale scene
scope score sense serve seven shall shape share sharp sheet shelf shell shift shirt shock shoot short shown sight since
sixth sixty sized skill sleep slide small smart smile smith smoke solid solve sorry sound south space spare speak speed
spend spent split spoke sport staff stage stake stand start state steam steel stick still stock stone stood store storm
story strip stuck study stuff style sugar suite super sweet table taken taste taxes teach teeth thank theft their theme
there these thick thing think third those three threw throw tight times tired title today topic total touch tough tower
track trade train treat trend trial tried tries truck truly trust truth twice under undue union unity until upper upset
urban usage usual valid value video virus visit vital voice waste watch water wheel where which while white whole whose
woman women world worry worse worst worth would wound write wrong wrote yield young youth`)

// prefixWords is the length of the random prefix that makes every prompt
// unique from its first tokens, so no prefix cache can serve any of it:
// 8 draws from ~500 words is about 72 bits.
const prefixWords = 8

// randomPrefix returns prefixWords random words.
func randomPrefix() string {
	var b strings.Builder
	for i := 0; i < prefixWords; i++ {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(words[rand.IntN(len(words))])
	}
	return b.String()
}

// fillerText is a long deterministic text that calibrated prompts are cut
// from (by characters); built once, grown on demand.
var filler struct {
	mu   sync.Mutex
	text string
}

func fillerPrefix(chars int) string {
	filler.mu.Lock()
	defer filler.mu.Unlock()
	if len(filler.text) < chars {
		r := rand.New(rand.NewPCG(1, 2))
		var b strings.Builder
		b.Grow(max(2*chars, 1<<16))
		b.WriteString(filler.text)
		for b.Len() < chars {
			b.WriteByte(' ')
			b.WriteString(words[r.IntN(len(words))])
		}
		filler.text = b.String()
	}
	return filler.text[:chars]
}

// promptText is the user message of a calibrated prompt: a fresh random
// prefix, then chars characters of filler.
func promptText(chars int) string {
	if chars <= 0 {
		return randomPrefix()
	}
	return randomPrefix() + fillerPrefix(chars)
}

// calibrated is a prompt size found for a target length.
type calibrated struct {
	target int
	chars  int // filler characters
	tokens int // what the server counted for it
	method string
}

// counter returns the server's token count for a prompt of chars filler
// characters (with some random prefix).
type counter func(ctx context.Context, chars int) (int, error)

// calibrate finds the filler length whose prompt the server counts as
// exactly target tokens: a short probe, secant steps from it, then
// bisection between the closest lengths below and above. It stops after
// maxIter counts; a tokenizer that cannot hit the target exactly (one that
// merges across the cut) gives the closest length below it. The prompt of
// the result never exceeds target.
func calibrate(ctx context.Context, target, maxIter int, count counter) (calibrated, error) {
	c := calibrated{target: target}
	n0, err := count(ctx, 0)
	if err != nil {
		return c, err
	}
	if n0 >= target {
		if n0 == target {
			c.tokens = n0
			return c, nil
		}
		return c, fmt.Errorf("a prompt of %d tokens cannot be built: the chat template and the random prefix alone are %d tokens", target, n0)
	}
	lo, nlo := 0, n0 // longest known length with count ≤ target
	hi, nhi := -1, 0 // shortest known length with count > target (-1: none)
	// A short probe first: text has at least one character per token, so
	// it never overshoots, and its slope aims the next guess. (Overshooting
	// costs a long prefill when counts come from usage feedback.)
	guess := min(64, target-n0)
	for i := 0; i < maxIter; i++ {
		if hi >= 0 && hi-lo <= 1 {
			break
		}
		if guess <= lo || (hi >= 0 && guess >= hi) {
			if hi < 0 {
				guess = lo * 2
			} else {
				guess = (lo + hi) / 2
			}
		}
		n, err := count(ctx, guess)
		if err != nil {
			return c, err
		}
		if n == target {
			c.chars, c.tokens = guess, n
			return c, nil
		}
		if n < target {
			if hi < 0 && guess >= lo+16 && n <= nlo {
				return c, fmt.Errorf("a prompt of %d tokens cannot be built: the server's count stays at %d however long the prompt (it truncates to its context?)", target, n)
			}
			lo, nlo = guess, n
		} else {
			hi, nhi = guess, n
		}
		// Secant between the bracketing points (or from the empty prompt).
		switch {
		case hi >= 0 && nhi > nlo:
			guess = lo + int(float64(hi-lo)*float64(target-nlo)/float64(nhi-nlo))
		case nlo > n0 && lo > 0:
			guess = int(float64(lo) * float64(target-n0) / float64(nlo-n0))
		default:
			guess = lo * 2
		}
	}
	c.chars, c.tokens = lo, nlo
	return c, nil
}

// longOutputPrompt is the decode prompt where the length is only capped
// (Ollama): a fresh random prefix, then an invitation to write at length,
// so that a model that can end early has no reason to.
func longOutputPrompt() string {
	return randomPrefix() + ". Write a long, detailed story of at least 3000 words about a lighthouse keeper. " +
		"Keep writing; do not summarise and do not stop early.\n\n"
}
