//! The identity of a durable function's code (F-7): `#[durable_function]` and
//! `#[durable_helper]` hash the tokens of the function they mark (so formatting and comments
//! do not count, code does) together with the identities of the helpers it declares. A
//! declared helper that is not marked has no identity to take: the program does not compile
//! — its code is refused before any step runs. Nor does a body that calls a function of its
//! own crate it does not declare (`calls.rs`): a change to that function would change what
//! the body does and not its identity. A revision registered again with other code
//! is refused at registration (`FunctionRegistry::register`), and an execution started on a
//! revision whose code has changed since pauses `revision_missing` instead of running it.
//!
//! ```text
//! #[openprogram::durable_helper]
//! fn amount(input: &serde_json::Value) -> u64 { /* … */ }
//!
//! #[openprogram::durable_function(name = "refund", revision = 1, helpers(amount))]
//! async fn refund(ctx: FunctionContext, input: Value) -> Result<Value, String> { /* … */ }
//!
//! let runtime = Runtime::builder().function(refund_durable()).open()?;
//! ```

use proc_macro::TokenStream;
use quote::{format_ident, quote, ToTokens};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::{parse_macro_input, Ident, ItemFn, LitInt, LitStr, Path, Token};

mod calls;

/// What the attribute says: `name = "…"`, `revision = N`, `helpers(a, path::b)`.
#[derive(Default)]
struct Attributes {
    name: Option<LitStr>,
    revision: Option<LitInt>,
    helpers: Vec<Path>,
}

impl Parse for Attributes {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut attributes = Attributes::default();
        while !input.is_empty() {
            let key: Ident = input.parse()?;
            match key.to_string().as_str() {
                "name" => {
                    input.parse::<Token![=]>()?;
                    attributes.name = Some(input.parse()?);
                }
                "revision" => {
                    input.parse::<Token![=]>()?;
                    attributes.revision = Some(input.parse()?);
                }
                "helpers" => {
                    let content;
                    syn::parenthesized!(content in input);
                    let helpers = Punctuated::<Path, Token![,]>::parse_terminated(&content)?;
                    attributes.helpers = helpers.into_iter().collect();
                }
                other => {
                    return Err(syn::Error::new(
                        key.span(),
                        format!("unknown attribute `{other}`: name, revision, helpers"),
                    ))
                }
            }
            if !input.is_empty() {
                input.parse::<Token![,]>()?;
            }
        }
        Ok(attributes)
    }
}

/// The hash of a function's tokens: its code, not its formatting, comments or doc comments
/// (`///` becomes a `doc` attribute, left out). Hashed token by token — each tree's kind
/// and text — rather than as the printed stream, whose spacing a compiler may change.
fn code_hash(function: &ItemFn) -> String {
    let mut function = function.clone();
    function
        .attrs
        .retain(|attribute| !attribute.path().is_ident("doc"));
    let mut hasher = blake3::Hasher::new();
    hash_tokens(&mut hasher, function.to_token_stream());
    hasher.finalize().to_hex()[..32].to_owned()
}

fn hash_tokens(hasher: &mut blake3::Hasher, tokens: proc_macro2::TokenStream) {
    use proc_macro2::{Delimiter, TokenTree};
    for tree in tokens {
        match tree {
            TokenTree::Group(group) => {
                let (open, close) = match group.delimiter() {
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::Brace => ("{", "}"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::None => ("\u{1}", "\u{2}"),
                };
                hasher.update(open.as_bytes());
                hash_tokens(hasher, group.stream());
                hasher.update(close.as_bytes());
            }
            TokenTree::Ident(ident) => {
                hasher.update(b"i");
                hasher.update(ident.to_string().as_bytes());
                hasher.update(b"\0");
            }
            TokenTree::Punct(punct) => {
                hasher.update(b"p");
                hasher.update(punct.as_char().to_string().as_bytes());
                let joint = punct.spacing() == proc_macro2::Spacing::Joint;
                hasher.update(if joint { b"j" } else { b"a" });
            }
            TokenTree::Literal(literal) => {
                hasher.update(b"l");
                hasher.update(literal.to_string().as_bytes());
                hasher.update(b"\0");
            }
        }
    }
}

/// The function giving the identity of the item `path` names (`a::b` → `a::__openprogram_identity_b`).
fn identity_fn(path: &Path) -> Path {
    let mut path = path.clone();
    if let Some(last) = path.segments.last_mut() {
        last.ident = format_ident!("__openprogram_identity_{}", last.ident);
    }
    path
}

/// The body of an identity function: this code's hash, then each helper's identity.
fn identity_body(hash: &str, helpers: &[Path]) -> proc_macro2::TokenStream {
    let helpers = helpers.iter().map(identity_fn);
    quote! {
        let mut identity = ::std::string::String::from(#hash);
        #(
            identity.push('+');
            identity.push_str(&#helpers());
        )*
        identity
    }
}

/// Marks a helper a durable function calls: its identity is its code's and its own declared
/// helpers' (`#[durable_helper(helpers(other))]`).
#[proc_macro_attribute]
pub fn durable_helper(attributes: TokenStream, item: TokenStream) -> TokenStream {
    let attributes = parse_macro_input!(attributes as Attributes);
    let function = parse_macro_input!(item as ItemFn);
    if attributes.name.is_some() || attributes.revision.is_some() {
        return syn::Error::new_spanned(
            &function.sig.ident,
            "a helper takes only `helpers(…)`: its name and revision are its function's",
        )
        .to_compile_error()
        .into();
    }
    if let Err(error) = calls::all_declared(&function, &attributes.helpers) {
        return error.to_compile_error().into();
    }
    let visibility = &function.vis;
    let identity = format_ident!("__openprogram_identity_{}", function.sig.ident);
    let body = identity_body(&code_hash(&function), &attributes.helpers);
    quote! {
        #function

        #[doc(hidden)]
        #visibility fn #identity() -> ::std::string::String {
            #body
        }
    }
    .into()
}

/// Declares a revision of a durable function: `name = "…"`, `revision = N` and the
/// `helpers(…)` its body calls (each marked `#[durable_helper]`). Generates
/// `NAME_durable() -> openprogram::DurableFunction`, whose identity is the hash of this
/// function's code and its helpers' identities.
#[proc_macro_attribute]
pub fn durable_function(attributes: TokenStream, item: TokenStream) -> TokenStream {
    let attributes = parse_macro_input!(attributes as Attributes);
    let function = parse_macro_input!(item as ItemFn);
    let (Some(name), Some(revision)) = (&attributes.name, &attributes.revision) else {
        return syn::Error::new_spanned(
            &function.sig.ident,
            "a durable function needs `name = \"…\"` and `revision = N`",
        )
        .to_compile_error()
        .into();
    };
    if name.value().is_empty() || revision.base10_parse::<u32>().map_or(true, |r| r == 0) {
        return syn::Error::new_spanned(
            &function.sig.ident,
            "a durable function's name is not empty and its revision is at least 1",
        )
        .to_compile_error()
        .into();
    }
    if !function.sig.generics.params.is_empty() || function.sig.receiver().is_some() {
        return syn::Error::new_spanned(
            &function.sig,
            "a durable function is a free async fn without generics: (FunctionContext, Value)",
        )
        .to_compile_error()
        .into();
    }
    if let Err(error) = calls::all_declared(&function, &attributes.helpers) {
        return error.to_compile_error().into();
    }
    let visibility = &function.vis;
    let body_name = &function.sig.ident;
    let constructor = format_ident!("{}_durable", function.sig.ident);
    let body = identity_body(&code_hash(&function), &attributes.helpers);
    quote! {
        #function

        /// This revision of the durable function, identified by its code and its helpers'.
        #visibility fn #constructor() -> ::openprogram::DurableFunction {
            let identity = { #body };
            ::openprogram::DurableFunction::with_identity(#name, #revision, &identity, #body_name)
        }
    }
    .into()
}
