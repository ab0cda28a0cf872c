// Command promrules checks Prometheus rule files as `promtool check rules` does: each file is
// parsed and validated by github.com/prometheus/prometheus/model/rulefmt (unknown fields refused,
// every expression parsed by the PromQL parser, every annotation and label template parsed).
// It prints the number of rules per file and exits 1 on any error.
//
// Usage: promrules FILE...
package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: promrules FILE...")
		os.Exit(2)
	}
	p := parser.NewParser(parser.Options{})
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	failed := false
	for _, f := range os.Args[1:] {
		groups, errs := rulefmt.ParseFile(f, false, model.UTF8Validation, p, logger)
		if len(errs) > 0 {
			failed = true
			fmt.Fprintf(os.Stderr, "%s: FAILED\n", f)
			for _, e := range errs {
				fmt.Fprintf(os.Stderr, "  %v\n", e)
			}
			continue
		}
		n := 0
		for _, g := range groups.Groups {
			n += len(g.Rules)
		}
		if n == 0 {
			failed = true
			fmt.Fprintf(os.Stderr, "%s: FAILED: no rules\n", f)
			continue
		}
		fmt.Printf("%s: SUCCESS: %d rules found\n", f, n)
	}
	if failed {
		os.Exit(1)
	}
}
