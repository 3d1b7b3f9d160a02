// Package promql finds the metric selectors in a PromQL expression: enough of
// the language to check a dashboard's or an alert's queries against the
// metrics the code exposes, no evaluation. Functions, aggregations, keywords,
// label names and literals are recognised and skipped; anything it cannot
// read is an error rather than a silently missed selector.
package promql

import (
	"fmt"
	"slices"
	"strings"
)

// Selector is one vector selector of an expression: a metric name and the
// label names its matchers use, in order of appearance.
type Selector struct {
	Name   string
	Labels []string
}

// Selectors returns every vector selector of expr, in order (none for an
// expression of literals alone, such as vector(1)). A selector
// written as {__name__="m"} names m; one with no name at all is an error,
// since nothing could check it. Grafana's variables ($__rate_interval,
// $job, ${job}) may stand where PromQL allows a duration or a literal, and
// inside strings.
func Selectors(expr string) ([]Selector, error) {
	toks, err := tokenize(expr)
	if err != nil {
		return nil, err
	}
	p := parser{toks: toks}
	return p.selectors()
}

// Names returns the distinct metric names expr selects, sorted.
func Names(expr string) ([]string, error) {
	sels, err := Selectors(expr)
	if err != nil {
		return nil, err
	}
	var names []string
	for _, s := range sels {
		names = append(names, s.Name)
	}
	slices.Sort(names)
	return slices.Compact(names), nil
}

// Functions are PromQL's functions (Prometheus 3); Aggregations its
// aggregation operators, which may take a by/without clause.
var (
	Functions = set("abs", "absent", "absent_over_time", "acos", "acosh", "asin", "asinh", "atan", "atanh",
		"avg_over_time", "ceil", "changes", "clamp", "clamp_max", "clamp_min", "cos", "cosh", "count_over_time",
		"day_of_month", "day_of_week", "day_of_year", "days_in_month", "deg", "delta", "deriv",
		"double_exponential_smoothing", "exp", "floor", "histogram_avg", "histogram_count",
		"histogram_fraction", "histogram_quantile", "histogram_stddev", "histogram_stdvar", "histogram_sum",
		"holt_winters", "hour", "idelta", "increase", "info", "irate", "label_join", "label_replace",
		"last_over_time", "ln", "log10", "log2", "mad_over_time", "max_over_time", "min_over_time", "minute",
		"month", "pi", "predict_linear", "present_over_time", "quantile_over_time", "rad", "rate", "resets",
		"round", "scalar", "sgn", "sin", "sinh", "sort", "sort_by_label", "sort_by_label_desc", "sort_desc",
		"sqrt", "stddev_over_time", "stdvar_over_time", "sum_over_time", "tan", "tanh", "time", "timestamp",
		"vector", "year",
		// The @ modifier's two.
		"start", "end")
	Aggregations = set("sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values",
		"bottomk", "topk", "quantile", "limitk", "limit_ratio")
)

// keywords are the words that are neither metrics nor functions: binary
// set operators, modifiers, and the clauses that take a label list.
var (
	keywords   = set("and", "or", "unless", "atan2", "bool", "offset")
	labelLists = set("by", "without", "on", "ignoring", "group_left", "group_right")
)

func set(words ...string) map[string]bool {
	m := make(map[string]bool, len(words))
	for _, w := range words {
		m[w] = true
	}
	return m
}

// tokKind is what a token is.
type tokKind int

const (
	tIdent  tokKind = iota // a name: metric, function, keyword, label
	tNumber                // a number or duration: 0.99, 5m, 1e-3, 0x1f
	tString                // '…', "…" or `…`
	tVar                   // a Grafana variable: $x, ${x}, [[x]]
	tPunct                 // ( ) { } [ ] , and operators
)

type token struct {
	kind tokKind
	text string
	pos  int
}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z'
}

func isIdentChar(c byte) bool { return isIdentStart(c) || '0' <= c && c <= '9' }

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

// tokenize splits s into tokens, dropping spaces and # comments.
func tokenize(s string) ([]token, error) {
	var toks []token
	for i := 0; i < len(s); {
		c := s[i]
		start := i
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
			continue
		case c == '#':
			for i < len(s) && s[i] != '\n' {
				i++
			}
			continue
		case c == '"' || c == '\'' || c == '`':
			i++
			for i < len(s) && s[i] != c {
				if s[i] == '\\' && c != '`' {
					i++
				}
				i++
			}
			if i >= len(s) {
				return nil, fmt.Errorf("promql: unterminated string at %d", start)
			}
			i++
			toks = append(toks, token{tString, s[start:i], start})
		case c == '$':
			i++
			if i < len(s) && s[i] == '{' {
				end := strings.IndexByte(s[i:], '}')
				if end < 0 {
					return nil, fmt.Errorf("promql: unterminated ${ at %d", start)
				}
				i += end + 1
			} else {
				for i < len(s) && isIdentChar(s[i]) {
					i++
				}
			}
			if i == start+1 {
				return nil, fmt.Errorf("promql: lone $ at %d", start)
			}
			toks = append(toks, token{tVar, s[start:i], start})
		case c == '[' && strings.HasPrefix(s[i:], "[["):
			end := strings.Index(s[i:], "]]")
			if end < 0 {
				return nil, fmt.Errorf("promql: unterminated [[ at %d", start)
			}
			i += end + 2
			toks = append(toks, token{tVar, s[start:i], start})
		case isDigit(c) || c == '.' && i+1 < len(s) && isDigit(s[i+1]):
			for i < len(s) && (isIdentChar(s[i]) || s[i] == '.' ||
				(s[i] == '+' || s[i] == '-') && (s[i-1] == 'e' || s[i-1] == 'E') && !strings.HasPrefix(s[start:], "0x")) {
				i++
			}
			toks = append(toks, token{tNumber, s[start:i], start})
		case isIdentStart(c):
			for i < len(s) && isIdentChar(s[i]) {
				i++
			}
			w := s[start:i]
			if lw := strings.ToLower(w); lw == "inf" || lw == "nan" {
				toks = append(toks, token{tNumber, w, start})
			} else {
				toks = append(toks, token{tIdent, w, start})
			}
		default:
			// Two-character operators first.
			for _, op := range []string{"==", "!=", "=~", "!~", ">=", "<="} {
				if strings.HasPrefix(s[i:], op) {
					i += 2
					break
				}
			}
			if i == start {
				if !strings.ContainsRune("(){}[],+-*/%^<>=@:", rune(c)) {
					return nil, fmt.Errorf("promql: unexpected %q at %d", c, start)
				}
				i++
			}
			toks = append(toks, token{tPunct, s[start:i], start})
		}
	}
	return toks, nil
}

// parser walks the tokens, keeping only selectors.
type parser struct {
	toks  []token
	i     int
	depth []string // open brackets, for balance
}

func (p *parser) peek(k int) (token, bool) {
	if p.i+k < len(p.toks) {
		return p.toks[p.i+k], true
	}
	return token{}, false
}

func (p *parser) isPunct(k int, text string) bool {
	t, ok := p.peek(k)
	return ok && t.kind == tPunct && t.text == text
}

func (p *parser) selectors() ([]Selector, error) {
	var out []Selector
	for p.i < len(p.toks) {
		t := p.toks[p.i]
		switch {
		case t.kind == tIdent && labelLists[t.text]:
			p.i++
			if p.isPunct(0, "(") { // the label list: names, not metrics
				if err := p.skipLabelList(); err != nil {
					return nil, err
				}
			} else if t.text != "group_left" && t.text != "group_right" {
				return nil, fmt.Errorf("promql: %s without a label list at %d", t.text, t.pos)
			}
		case t.kind == tIdent && keywords[t.text]:
			p.i++
		case t.kind == tIdent && p.isPunct(1, "("):
			if !Functions[t.text] && !Aggregations[t.text] {
				return nil, fmt.Errorf("promql: unknown function %s at %d", t.text, t.pos)
			}
			p.i++
		case t.kind == tIdent && Aggregations[t.text] && p.nextIsLabelClause():
			p.i++ // sum by (l) (…): the clause is read next round
		case t.kind == tIdent:
			p.i++
			sel := Selector{Name: t.text}
			if p.isPunct(0, "{") {
				if err := p.matchers(&sel); err != nil {
					return nil, err
				}
			}
			out = append(out, sel)
		case t.kind == tPunct && t.text == "{":
			var sel Selector
			if err := p.matchers(&sel); err != nil {
				return nil, err
			}
			if sel.Name == "" {
				return nil, fmt.Errorf("promql: a selector with no metric name at %d", t.pos)
			}
			out = append(out, sel)
		case t.kind == tPunct && strings.Contains("([", t.text):
			p.depth = append(p.depth, t.text)
			p.i++
		case t.kind == tPunct && strings.Contains(")]", t.text):
			want := map[string]string{")": "(", "]": "["}[t.text]
			if len(p.depth) == 0 || p.depth[len(p.depth)-1] != want {
				return nil, fmt.Errorf("promql: unbalanced %s at %d", t.text, t.pos)
			}
			p.depth = p.depth[:len(p.depth)-1]
			p.i++
		case t.kind == tPunct && t.text == "}":
			return nil, fmt.Errorf("promql: unbalanced } at %d", t.pos)
		default:
			p.i++
		}
	}
	if len(p.depth) > 0 {
		return nil, fmt.Errorf("promql: unclosed %s", p.depth[len(p.depth)-1])
	}
	return out, nil
}

func (p *parser) nextIsLabelClause() bool {
	t, ok := p.peek(1)
	return ok && t.kind == tIdent && (t.text == "by" || t.text == "without")
}

// skipLabelList skips "(a, b, …)" at p.i.
func (p *parser) skipLabelList() error {
	open := p.toks[p.i]
	p.i++
	for ; p.i < len(p.toks); p.i++ {
		t := p.toks[p.i]
		switch {
		case t.kind == tPunct && t.text == ")":
			p.i++
			return nil
		case t.kind == tIdent || t.kind == tString || t.kind == tPunct && t.text == ",":
		default:
			return fmt.Errorf("promql: %q in a label list at %d", t.text, t.pos)
		}
	}
	return fmt.Errorf("promql: unclosed label list at %d", open.pos)
}

// matchers reads "{l op "v", …}" at p.i into sel. A bare string matcher
// ({"name"}, Prometheus 3's quoted metric name) or __name__="m" names the metric.
func (p *parser) matchers(sel *Selector) error {
	open := p.toks[p.i]
	p.i++
	for {
		t, ok := p.peek(0)
		if !ok {
			return fmt.Errorf("promql: unclosed { at %d", open.pos)
		}
		if t.kind == tPunct && t.text == "}" {
			p.i++
			return nil
		}
		if t.kind == tString && (p.isPunct(1, ",") || p.isPunct(1, "}")) {
			if sel.Name != "" {
				return fmt.Errorf("promql: two metric names at %d", t.pos)
			}
			sel.Name = unquote(t.text)
			p.i++
		} else {
			op, _ := p.peek(1)
			val, _ := p.peek(2)
			if t.kind != tIdent && t.kind != tString || op.kind != tPunct ||
				!slices.Contains([]string{"=", "!=", "=~", "!~"}, op.text) ||
				val.kind != tString && val.kind != tVar {
				return fmt.Errorf("promql: bad label matcher at %d", t.pos)
			}
			name := t.text
			if t.kind == tString {
				name = unquote(name)
			}
			if name == "__name__" && op.text == "=" && val.kind == tString {
				if sel.Name != "" {
					return fmt.Errorf("promql: two metric names at %d", t.pos)
				}
				sel.Name = unquote(val.text)
			} else {
				sel.Labels = append(sel.Labels, name)
			}
			p.i += 3
		}
		if p.isPunct(0, ",") {
			p.i++
		} else if _, more := p.peek(0); !more {
			return fmt.Errorf("promql: unclosed { at %d", open.pos)
		} else if !p.isPunct(0, "}") {
			return fmt.Errorf("promql: expected , or } in a selector at %d", open.pos)
		}
	}
}

// unquote strips a string token's quotes; escapes are left as written (no
// metric or label name of ours has one).
func unquote(s string) string { return s[1 : len(s)-1] }
