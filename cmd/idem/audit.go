package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"strings"

	"github.com/idemkit/idem/internal/cli"
)

// auditActor checks the --actor and --reason of an action that can make
// work run twice: the reason is required; the actor defaults to the OS
// user, with a warning on stderr.
func auditActor(actor, reason string) (string, error) {
	if strings.TrimSpace(reason) == "" {
		return "", cli.Usagef("--reason is required: it is recorded with the action in the audit trail")
	}
	if strings.TrimSpace(actor) != "" {
		return actor, nil
	}
	name := os.Getenv("USER")
	if u, err := user.Current(); err == nil && u.Username != "" {
		name = u.Username
	}
	if name == "" {
		return "", cli.Usagef("--actor is required: the OS user is unknown")
	}
	fmt.Fprintf(os.Stderr, "warning: no --actor given: recording the OS user %q\n", name)
	return name, nil
}

// logAudit logs an operator action on stderr once it is done (a refused
// one is the command's error).
func logAudit(action, subject, actor, reason string, err error) {
	if err != nil {
		return
	}
	slog.New(slog.NewTextHandler(os.Stderr, nil)).Info("action", "action", action, "subject", subject, "actor", actor, "reason", reason)
}
