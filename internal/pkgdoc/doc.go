// Package pkgdoc holds no code: its test checks that every package in the
// module has a package comment and every exported name a doc comment.
package pkgdoc
