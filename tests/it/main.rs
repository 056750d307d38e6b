//! Integration tests of the `openprogram` package. Today: `tidy`, which keeps the
//! conventions of GUIDE.md honest across the workspace.

mod tidy;
