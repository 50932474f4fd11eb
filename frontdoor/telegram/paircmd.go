package telegram

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"gpuhost/internal/exitclass"
	"gpuhost/internal/pairing"
)

// NewPairCmd is `gpuhost pair`: the operator's side of pairing, on the
// machine, because that is where the right to add someone lives. stateDir
// returns the configured state directory (the lead's loadConfig(cmd) →
// cfg.StateDir); it is called when a subcommand runs, so flags are parsed.
func NewPairCmd(stateDir func(cmd *cobra.Command) (string, error)) *cobra.Command {
	store := func(cmd *cobra.Command) (*pairing.Store, error) {
		dir, err := stateDir(cmd)
		if err != nil {
			return nil, err
		}
		return pairing.New(dir), nil
	}
	root := &cobra.Command{
		Use:   "pair",
		Short: "Approve or revoke Telegram bot users (pairing codes)",
		Long: "A Telegram user who is not allowlisted gets a one-time pairing code from the bot and nothing else.\n" +
			"Approve it here, on the machine; no chat message can change who is allowed.",
	}
	root.AddCommand(newPairListCmd(store), newPairApproveCmd(store), newPairAddCmd(store), newPairRevokeCmd(store), newPairPurgeCmd(store))
	return root
}

// pairStore opens the pairing store of the configured state directory.
type pairStore func(cmd *cobra.Command) (*pairing.Store, error)

// newPairListCmd is `gpuhost pair list`.
func newPairListCmd(store pairStore) *cobra.Command {
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List pending pairing codes and allowlisted users",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := store(cmd)
			if err != nil {
				return err
			}
			ps, perr := s.List()
			a, aerr := s.ReadAllowlist()
			if asJSON {
				if perr != nil {
					return perr
				}
				if aerr != nil {
					return aerr
				}
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(map[string]any{"pending": nonNil(ps), "allowlist": a.Users})
			}
			w := cmd.OutOrStdout()
			if perr != nil {
				fmt.Fprintln(w, "pending codes: unreadable:", perr)
			} else {
				printPending(w, ps, time.Now())
			}
			fmt.Fprintln(w)
			if aerr != nil {
				fmt.Fprintln(w, "allowlist: unreadable (the bot answers nobody until it is fixed or removed):", aerr)
			} else {
				printAllowlist(w, a)
			}
			if perr != nil {
				return perr
			}
			return aerr
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return list
}

// newPairApproveCmd is `gpuhost pair approve CODE`.
func newPairApproveCmd(store pairStore) *cobra.Command {
	return &cobra.Command{
		Use:   "approve CODE",
		Short: "Allow the Telegram user who got CODE (valid for 10 minutes)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			s, err := store(cmd)
			if err != nil {
				return err
			}
			e, err := s.Approve(args[0])
			if err != nil {
				return pairNameError(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "approved user %d (%s): the bot answers them from their next message and sends them notifications\n",
				e.UserID, describeUser(e.Username, e.FirstName))
			return nil
		},
	}
}

// newPairAddCmd is `gpuhost pair add USER_ID`: pairing without a code, for
// when the operator knows the user id (the user can read it from any
// "user info" bot, or `gpuhost pair list` shows it) and codes cannot get
// through, e.g. during a flood of strangers. It writes the allowlist
// atomically under the store's lock, so it is safe while the daemon runs;
// the bot reads the allowlist on every message.
func newPairAddCmd(store pairStore) *cobra.Command {
	var name string
	add := &cobra.Command{
		Use:   "add USER_ID",
		Short: "Allow a Telegram user by id, without a pairing code",
		Args:  userIDArg("add", "e.g. 123456789"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, _ := strconv.ParseInt(args[0], 10, 64) // checked by userIDArg
			s, err := store(cmd)
			if err != nil {
				return err
			}
			e, err := s.Add(id, 0, "", name)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "added user %d (%s): the running bot answers them from their next message and sends them notifications\n",
				e.UserID, describeUser(e.Username, e.FirstName))
			return nil
		},
	}
	add.Flags().StringVar(&name, "name", "", "a name to show in `gpuhost pair list`")
	return add
}

// userIDArg checks the one USER_ID argument in cobra's argument step, so
// that a bad id is a usage error (exit 64, nothing run) like a wrong
// argument count, not a problem the command found.
func userIDArg(verb, hint string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := cobra.ExactArgs(1)(cmd, args); err != nil {
			return err
		}
		if id, err := strconv.ParseInt(args[0], 10, 64); err != nil || id <= 0 {
			return fmt.Errorf("%s: %q is not a Telegram user id (a positive number; %s)", verb, args[0], hint)
		}
		return nil
	}
}

// pairNameError marks a code or user the store does not know (or a code
// that cannot be one) as the caller's usage error (64); an expired or
// replaced code and a file that cannot be read keep their own class.
func pairNameError(err error) error {
	if errors.Is(err, pairing.ErrUnknownCode) || errors.Is(err, pairing.ErrMalformedCode) || errors.Is(err, pairing.ErrNotAllowlisted) {
		return exitclass.UsageErr(err)
	}
	return err
}

// newPairRevokeCmd is `gpuhost pair revoke USER_ID`.
func newPairRevokeCmd(store pairStore) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke USER_ID",
		Short: "Remove a Telegram user from the allowlist",
		Args:  userIDArg("revoke", "see gpuhost pair list"),
		RunE: func(cmd *cobra.Command, args []string) error {
			id, _ := strconv.ParseInt(args[0], 10, 64) // checked by userIDArg
			s, err := store(cmd)
			if err != nil {
				return err
			}
			e, err := s.Revoke(id)
			if err != nil {
				return pairNameError(err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "revoked user %d (%s): the bot ignores them from their next message\n", e.UserID, describeUser(e.Username, e.FirstName))
			return nil
		},
	}
}

// newPairPurgeCmd is `gpuhost pair purge [--all]`.
func newPairPurgeCmd(store pairStore) *cobra.Command {
	var all bool
	purge := &cobra.Command{
		Use:   "purge",
		Short: "Remove expired and evicted pairing codes (--all: every pending code)",
		Long: "Removes expired and evicted codes from the pending list; with --all, every pending code, live ones\n" +
			"included, and an unreadable pending file is replaced by an empty one. The allowlist is not touched.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := store(cmd)
			if err != nil {
				return err
			}
			n, err := s.Purge(all)
			if err != nil {
				return err
			}
			if n < 0 {
				fmt.Fprintf(cmd.OutOrStdout(), "replaced the unreadable %s with an empty one; the allowlist is unchanged\n", s.PendingPath())
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "purged %d pairing code(s); the allowlist is unchanged\n", n)
			return nil
		},
	}
	purge.Flags().BoolVar(&all, "all", false, "remove live codes too (and replace an unreadable pending file)")
	return purge
}

func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}

func describeUser(username, first string) string {
	switch {
	case username != "" && first != "":
		return "@" + username + ", " + first
	case username != "":
		return "@" + username
	case first != "":
		return first
	}
	return "no name"
}

func printPending(w io.Writer, ps []pairing.Pending, now time.Time) {
	if len(ps) == 0 {
		fmt.Fprintln(w, "no pending pairing codes")
		return
	}
	fmt.Fprintln(w, "pending pairing codes (approve with: gpuhost pair approve CODE)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "CODE\tUSER ID\tUSERNAME\tFIRST NAME\tAGE\tSTATUS")
	for _, p := range ps {
		status := "valid for " + p.ExpiresAt().Sub(now).Round(time.Second).String()
		switch {
		case p.Evicted:
			status = "evicted"
		case p.Expired(now):
			status = "expired"
		}
		user := "-"
		if p.Username != "" {
			user = "@" + p.Username
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", p.Code, p.UserID, user, orDash(p.FirstName),
			now.Sub(p.CreatedAt).Round(time.Second), status)
	}
	tw.Flush()
}

func printAllowlist(w io.Writer, a pairing.Allowlist) {
	if len(a.Users) == 0 {
		fmt.Fprintln(w, "allowlist is empty")
		return
	}
	fmt.Fprintln(w, "allowlisted users (remove with: gpuhost pair revoke USER_ID)")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "USER ID\tUSERNAME\tFIRST NAME\tAPPROVED")
	for _, e := range a.Users {
		user := "-"
		if e.Username != "" {
			user = "@" + e.Username
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\n", e.UserID, user, orDash(e.FirstName), e.ApprovedAt.Local().Format(time.DateTime))
	}
	tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
