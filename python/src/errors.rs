//! Rust errors as Python exceptions: `FileNotFoundError`, `PermissionError`,
//! `FileExistsError`, `ValueError` (bad options and states, naming them) and
//! `ShardfeedError` for the rest.

use pyo3::create_exception;
use pyo3::exceptions::{
    PyException, PyFileExistsError, PyFileNotFoundError, PyPermissionError, PyValueError,
};
use pyo3::prelude::*;
use shardfeed_format::FormatError;
use shardfeed_loader::LoaderError;
use shardfeed_preprocess::PreprocessError;

create_exception!(
    shardfeed,
    ShardfeedError,
    PyException,
    "A shardfeed failure other than a missing file, a permission problem or a bad option. The message is the Rust error's, naming the shard, row group, file or option."
);

/// Which Python exception a failure maps to.
pub(crate) enum Kind {
    NotFound,
    Permission,
    Exists,
    Value,
    Other,
}

pub(crate) fn store_kind(e: &object_store::Error) -> Kind {
    match e {
        object_store::Error::NotFound { .. } => Kind::NotFound,
        object_store::Error::PermissionDenied { .. }
        | object_store::Error::Unauthenticated { .. } => Kind::Permission,
        object_store::Error::AlreadyExists { .. } => Kind::Exists,
        _ => Kind::Other,
    }
}

pub(crate) fn io_kind(e: &std::io::Error) -> Kind {
    match e.kind() {
        std::io::ErrorKind::NotFound => Kind::NotFound,
        std::io::ErrorKind::PermissionDenied => Kind::Permission,
        std::io::ErrorKind::AlreadyExists => Kind::Exists,
        _ => Kind::Other,
    }
}

pub(crate) fn format_kind(e: &FormatError) -> Kind {
    match e {
        FormatError::Store { error, .. } => store_kind(error.inner()),
        FormatError::LocalPath { source, .. } => io_kind(source),
        FormatError::BadLocation { .. } | FormatError::BadSize { .. } => Kind::Value,
        _ => Kind::Other,
    }
}

pub(crate) fn raise(kind: Kind, message: String) -> PyErr {
    match kind {
        Kind::NotFound => PyFileNotFoundError::new_err(message),
        Kind::Permission => PyPermissionError::new_err(message),
        Kind::Exists => PyFileExistsError::new_err(message),
        Kind::Value => PyValueError::new_err(message),
        Kind::Other => ShardfeedError::new_err(message),
    }
}

pub(crate) fn loader_error(e: LoaderError) -> PyErr {
    let kind = match &e {
        LoaderError::Format(f) => format_kind(f),
        LoaderError::MissingShard { .. } => Kind::NotFound,
        LoaderError::Store { error, .. } => store_kind(error.inner()),
        LoaderError::Io { source, .. } => io_kind(source),
        LoaderError::BadOption { .. } | LoaderError::BadState { .. } => Kind::Value,
        _ => Kind::Other,
    };
    raise(kind, e.to_string())
}

pub(crate) fn preprocess_error(e: PreprocessError) -> PyErr {
    let kind = match &e {
        PreprocessError::Format(f) => format_kind(f),
        PreprocessError::InputNotFound { .. } | PreprocessError::NoMatch { .. } => Kind::NotFound,
        PreprocessError::Io { source, .. } => io_kind(source),
        PreprocessError::BadOption { .. }
        | PreprocessError::UnknownFormat { .. }
        | PreprocessError::NoInputs => Kind::Value,
        PreprocessError::DatasetExists { .. } => Kind::Exists,
        _ => Kind::Other,
    };
    raise(kind, e.to_string())
}

pub(crate) fn format_error(e: FormatError) -> PyErr {
    raise(format_kind(&e), e.to_string())
}

pub(crate) fn bad_option(option: &str, reason: impl std::fmt::Display) -> PyErr {
    PyValueError::new_err(format!("invalid option {option}: {reason}"))
}
