//! End-to-end tests of the `shardfeed` binary and libraries.

mod forge;
mod fuzz;
mod support;

mod cloud;
mod images;
mod loader;
mod metrics;
mod mixing;
mod mixture;
mod shard;
mod storage;
mod tokenize;
mod trust;
