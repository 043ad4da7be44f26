//! `terms`: the definitions `fit` and `estimate` share (ARCHITECTURE.md §9). A fit regresses
//! measured peaks on these terms and an estimate evaluates the fitted coefficients on the same
//! terms of a query, so both compute them here and can never disagree on a definition.
//!
//! - [`llm`] (re-exported here): the eight terms of a language-model phase ([`Term`]), their
//!   analytic priors, and the terms of a CSV row ([`record_terms`]) or of features
//!   ([`terms`], [`train_terms`]).
//! - [`generation`]: the terms of a generation phase ([`generation::GenTerm`]), from the
//!   architecture ([`generation::GenArch`]) and the query ([`generation::GenQuery`]).
//!
//! A constants file keys its coefficients by the terms' names ([`Term::name`],
//! [`generation::GenTerm::name`]); those names are part of its format.
//!
//! This module reads only the vocabulary, records, features and model configs: never `fit`
//! or `estimate`, which both read it.
pub mod generation;
pub mod llm;

pub use llm::{
    phase_tokens, priors, record_terms, terms, train_terms, with_grads, Term, Terms, N_TERMS, TERMS,
};
