package bench

// Every scenario's options follow one rule: a field left at its zero value
// (or, for a count or a duration, at zero or less) takes the scenario's
// default. These two apply it, field by field, in each withDefaults.

// orDefault sets *v to def unless *v is positive.
func orDefault[T ~int | ~int64 | ~float64](v *T, def T) {
	if *v <= 0 {
		*v = def
	}
}

// orDefaultIfZero sets *v to def if *v is its type's zero value.
func orDefaultIfZero[T comparable](v *T, def T) {
	var zero T
	if *v == zero {
		*v = def
	}
}
