package testenv

import (
	"io"
	"strings"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// Metrics parses a Prometheus text scrape into one value a series, keyed
// name{label=value,...} (just name without labels): a counter's or gauge's
// value, and a histogram's sample count as name_count{...}.
func Metrics(r io.Reader) (map[string]float64, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, err
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, l.GetName()+"="+l.GetValue())
			}
			key := func(name string) string {
				if len(labels) == 0 {
					return name
				}
				return name + "{" + strings.Join(labels, ",") + "}"
			}
			switch {
			case m.Counter != nil:
				out[key(name)] = m.Counter.GetValue()
			case m.Gauge != nil:
				out[key(name)] = m.Gauge.GetValue()
			case m.Histogram != nil:
				out[key(name+"_count")] = float64(m.Histogram.GetSampleCount())
			}
		}
	}
	return out, nil
}
