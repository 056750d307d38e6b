//! F-7: the functions of its own crate a body calls must be its declared helpers, so that
//! its identity covers them. A proc macro sees names, not what they resolve to, so the rule
//! is by how a call is written:
//!
//! - a call by a bare name (`amount(x)`) or through `crate::`, `self::` or `super::` is a call
//!   of this crate's code: it must name a declared helper, a function or closure the body
//!   defines itself, or one of the body's own bindings (a closure passed in);
//! - a call through another path (`serde_json::to_string(x)`, `Value::from(x)`) is taken as
//!   another crate's (its version is the build's, not this function's): a function of this
//!   crate reached through a module path (`helpers::amount`) is not seen, so call one by its
//!   `crate::` path;
//! - methods (`x.amount()`) are not seen either.
//!
//! Calls inside a macro's arguments (`json!({"n": amount(x)})`) are read from its tokens.

use std::collections::BTreeSet;

use syn::visit::Visit;
use syn::{Expr, ExprCall, ItemFn, Pat, Path};

/// An error naming each call of this crate's code the attribute does not declare.
pub(crate) fn all_declared(function: &ItemFn, helpers: &[Path]) -> syn::Result<()> {
    let undeclared = undeclared(function, helpers);
    let Some(first) = undeclared.first() else {
        return Ok(());
    };
    let names: Vec<String> = undeclared
        .iter()
        .map(|(name, _)| format!("`{name}`"))
        .collect();
    Err(syn::Error::new(
        first.1,
        format!(
            "this body calls {}, which `helpers(…)` does not declare: a change there would \
             change what the function does and not its identity. Mark each \
             #[durable_helper] and declare it, or, for another crate's function, call it by \
             its path (`serde_json::to_string`)",
            names.join(", ")
        ),
    ))
}

/// Each call of this crate's code `function` makes that `helpers` does not declare, with
/// where it is, in the order written.
pub(crate) fn undeclared(function: &ItemFn, helpers: &[Path]) -> Vec<(String, proc_macro2::Span)> {
    let mut calls = Calls::default();
    // Itself (a recursive helper) and the prelude's one function.
    calls.own.insert(function.sig.ident.to_string());
    calls.own.insert("drop".into());
    for input in &function.sig.inputs {
        if let syn::FnArg::Typed(typed) = input {
            calls.bind(&typed.pat);
        }
    }
    calls.visit_block(&function.block);
    let declared: BTreeSet<String> = helpers.iter().filter_map(last_name).collect();
    calls
        .called
        .into_iter()
        .filter(|(name, _)| !declared.contains(name) && !calls.own.contains(name))
        .collect()
}

fn last_name(path: &Path) -> Option<String> {
    path.segments
        .last()
        .map(|segment| segment.ident.to_string())
}

/// What a body calls of this crate's code, and the names it gives itself.
#[derive(Default)]
struct Calls {
    called: Vec<(String, proc_macro2::Span)>,
    /// Its bindings (parameters, `let`s, closure parameters) and the functions it defines.
    own: BTreeSet<String>,
}

impl Calls {
    fn bind(&mut self, pattern: &Pat) {
        BindingNames(&mut self.own).visit_pat(pattern);
    }

    /// The calls in a macro's tokens, which are no syntax tree: a name (or a path) right
    /// before a parenthesis, not after a `.` (a method).
    fn scan(&mut self, tokens: proc_macro2::TokenStream) {
        use proc_macro2::{Delimiter, TokenTree};
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        for (index, tree) in trees.iter().enumerate() {
            let TokenTree::Group(group) = tree else {
                continue;
            };
            if group.delimiter() == Delimiter::Parenthesis && index > 0 {
                if let Some((segments, span)) = path_before(&trees, index) {
                    if let Some(name) = own_crates(&segments) {
                        self.called.push((name, span));
                    }
                }
            }
            self.scan(group.stream());
        }
    }
}

/// Rust's keywords: one before a parenthesis (`if (x)`, `fn(u64)`, `let (a, b)`) is no call.
const KEYWORDS: [&str; 38] = [
    "as", "async", "await", "box", "break", "const", "continue", "crate", "dyn", "else", "enum",
    "extern", "false", "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move",
    "mut", "pub", "ref", "return", "self", "static", "struct", "super", "trait", "true", "type",
    "unsafe", "use", "where", "while",
];

/// The path written right before `trees[end]` (`a::b::c`), with its first token's span;
/// `None` if there is none, or it follows a `.` (a method) or is a keyword (`if (x)`).
fn path_before(
    trees: &[proc_macro2::TokenTree],
    end: usize,
) -> Option<(Vec<String>, proc_macro2::Span)> {
    use proc_macro2::TokenTree;
    let ident = |at: usize| match &trees[at] {
        TokenTree::Ident(ident) => Some(ident.clone()),
        _ => None,
    };
    let punct = |at: usize, c: char| matches!(&trees[at], TokenTree::Punct(p) if p.as_char() == c);
    let last = ident(end - 1)?;
    let mut start = end - 1;
    while start >= 3 && punct(start - 1, ':') && punct(start - 2, ':') && ident(start - 3).is_some()
    {
        start -= 3;
    }
    // After a `.`: a method. After `>::` (`Vec::<u8>::new`, `<T as Tr>::f`): a path through
    // a type, taken as another crate's like any path.
    let qualified = start >= 2 && punct(start - 1, ':') && punct(start - 2, ':');
    if (start > 0 && punct(start - 1, '.')) || qualified {
        return None;
    }
    if KEYWORDS.contains(&last.to_string().as_str()) {
        return None;
    }
    let segments = (start..end)
        .step_by(3)
        .filter_map(ident)
        .map(|i| i.to_string());
    Some((segments.collect(), ident(start)?.span()))
}

/// Collects every name a pattern binds.
struct BindingNames<'a>(&'a mut BTreeSet<String>);

impl Visit<'_> for BindingNames<'_> {
    fn visit_pat_ident(&mut self, pattern: &syn::PatIdent) {
        self.0.insert(pattern.ident.to_string());
        syn::visit::visit_pat_ident(self, pattern);
    }
}

impl Visit<'_> for Calls {
    fn visit_expr_call(&mut self, call: &ExprCall) {
        if let Expr::Path(path) = &*call.func {
            let segments: Vec<String> = (path.path.segments.iter())
                .map(|segment| segment.ident.to_string())
                .collect();
            if let Some(name) = own_crates(&segments) {
                self.called.push((name, path.path.segments[0].ident.span()));
            }
        }
        syn::visit::visit_expr_call(self, call);
    }

    fn visit_macro(&mut self, mac: &syn::Macro) {
        self.scan(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }

    fn visit_local(&mut self, local: &syn::Local) {
        self.bind(&local.pat);
        syn::visit::visit_local(self, local);
    }

    fn visit_expr_closure(&mut self, closure: &syn::ExprClosure) {
        for input in &closure.inputs {
            self.bind(input);
        }
        syn::visit::visit_expr_closure(self, closure);
    }

    fn visit_item_fn(&mut self, item: &ItemFn) {
        // Defined in the body: its tokens are the body's, hashed with it.
        self.own.insert(item.sig.ident.to_string());
        syn::visit::visit_item_fn(self, item);
    }
}

/// The name a call of the path `segments` calls, if it is written as a call of this crate's
/// code: a bare lower-case name (not a tuple struct or variant, `Some(x)`), or `crate::`,
/// `self::` or `super::` first.
fn own_crates(segments: &[String]) -> Option<String> {
    let (first, name) = (segments.first()?, segments.last()?);
    let local = match segments.len() {
        1 => name.starts_with(|c: char| c.is_lowercase() || c == '_'),
        _ => matches!(first.as_str(), "crate" | "self" | "super"),
    };
    (local && name.starts_with(|c: char| !c.is_uppercase())).then(|| name.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn undeclared_in(body: &str, helpers: &[&str]) -> Vec<String> {
        let function: ItemFn = syn::parse_str(body).expect("a function");
        let helpers: Vec<Path> = helpers
            .iter()
            .map(|path| syn::parse_str(path).expect("a path"))
            .collect();
        undeclared(&function, &helpers)
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    #[test]
    fn f7_a_call_of_this_crates_code_must_be_a_declared_helper() {
        let body = "async fn refund(ctx: C, input: V) -> R { let n = amount(&input); crate::tax::rate(n) + super::fee(n) }";
        assert_eq!(undeclared_in(body, &[]), vec!["amount", "rate", "fee"]);
        assert_eq!(
            undeclared_in(body, &["amount", "crate::tax::rate", "super::fee"]),
            Vec::<String>::new()
        );
    }

    #[test]
    fn f7_other_crates_constructors_bindings_and_inner_functions_are_no_undeclared_calls() {
        let body = "async fn f(ctx: C, input: V) -> R {
            let double = |x: u64| x * 2;
            fn halve(x: u64) -> u64 { x / 2 }
            let shown = serde_json::to_string(&input);
            let value = Value::from(3);
            Ok(Some(double(halve(ctx(1)))).map(|each| each))
        }";
        assert_eq!(undeclared_in(body, &[]), Vec::<String>::new());
    }

    #[test]
    fn f7_a_call_inside_a_macros_arguments_is_seen_and_a_method_is_not() {
        let body = r#"fn h(x: u64) -> V {
            json!({"n": amount(x), "m": crate::tax::rate(x), "s": x.to_string(), "v": serde_json::to_string(&x)});
            assert!(matches!(Some(x), Some(_)) && (x > 1));
            format!("{}", fee(x))
        }"#;
        assert_eq!(undeclared_in(body, &["fee"]), vec!["amount", "rate"]);
    }

    #[test]
    fn f7_recursion_keywords_typed_paths_and_drop_are_no_undeclared_calls() {
        let body = r#"fn walk(n: u64) -> u64 {
            drop(n);
            let f: fn(u64) -> u64 = walk;
            select!(x => { let (a, b) = (1, 2); if (a > b) { json!(Vec::<u8>::new()) } });
            format!("{}", <u64 as From<u8>>::from(1));
            if n == 0 { 0 } else { walk(n - 1) }
        }"#;
        assert_eq!(undeclared_in(body, &[]), Vec::<String>::new());
    }

    #[test]
    fn f7_a_call_hidden_in_a_closure_or_a_block_is_seen() {
        let body = "fn h(x: u64) -> u64 { let f = |y| secret(y); { f(x) + other(1) } }";
        assert_eq!(undeclared_in(body, &["other"]), vec!["secret"]);
    }
}
