// Package exitclass is the one exit-status vocabulary of every gpuhost
// command: a package that knows why it failed returns an error carrying
// its class, and package main ends the process with that class, so no
// command keeps a private set of statuses to be translated.
//
// 64, 69 and 78 are sysexits.h's EX_USAGE, EX_UNAVAILABLE and EX_CONFIG.
package exitclass

import (
	"errors"
	"net"
	"syscall"
)

// Class is a process exit status of the contract.
type Class int

// The classes. An error that carries none is a Problem: the command ran
// and found something wrong.
const (
	OK          Class = 0
	Problem     Class = 1
	Usage       Class = 64
	Unavailable Class = 69
	Config      Class = 78
)

// Classed is an error that knows its class; any error type may implement
// it (config.Error, api.UnreachableError do).
type Classed interface {
	error
	ExitClass() Class
}

// Error gives err a class.
type Error struct {
	Class Class
	Err   error
}

func (e *Error) Error() string    { return e.Err.Error() }
func (e *Error) Unwrap() error    { return e.Err }
func (e *Error) ExitClass() Class { return e.Class }

// New wraps err (nil stays nil) as class c.
func New(c Class, err error) error {
	if err == nil {
		return nil
	}
	return &Error{Class: c, Err: err}
}

// UsageErr marks err as a wrong use of the command: an unknown flag,
// a bad flag value or argument, an unknown name (64).
func UsageErr(err error) error { return New(Usage, err) }

// ConfigErr marks err as a configuration error (78).
func ConfigErr(err error) error { return New(Config, err) }

// UnavailableErr marks err as "a service the command needs is
// unreachable" (69).
func UnavailableErr(err error) error { return New(Unavailable, err) }

// ProblemErr marks err as "ran and found a problem" (1), so that a
// class found deeper in its chain does not decide.
func ProblemErr(err error) error { return New(Problem, err) }

// Of is err's class: the outermost class its chain carries (the code
// that wrapped last knew the most), else Unavailable for a connection
// that could not be made (nothing listens, no route), else Problem.
// A nil error is OK.
func Of(err error) Class {
	if err == nil {
		return OK
	}
	var c Classed
	if errors.As(err, &c) {
		return c.ExitClass()
	}
	if Refused(err) {
		return Unavailable
	}
	return Problem
}

// Has reports whether err's chain carries a class of its own.
func Has(err error) bool {
	var c Classed
	return errors.As(err, &c)
}

// Refused reports a connection that could not be made: a dial that
// failed, or a refused connection.
func Refused(err error) bool {
	var oe *net.OpError
	return errors.As(err, &oe) && oe.Op == "dial" || errors.Is(err, syscall.ECONNREFUSED)
}
