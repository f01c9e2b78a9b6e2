//! Panics as errors: code run through [`catch`] (a pipeline stage, a call
//! into a parser that may panic on malformed bytes) has its panic caught and
//! returned as its message, without the default hook printing it. A panic
//! hook, chained to the one installed before, stays quiet only on threads
//! that are inside [`catch`] (or [`quietly`]); every other panic is printed
//! as usual.

use std::cell::Cell;
use std::panic::AssertUnwindSafe;
use std::sync::Once;

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                previous(info);
            }
        }));
    });
}

/// The message of a caught panic.
pub fn message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// Run `f`; a panic in it is caught (printing nothing) and returned as its message.
pub fn catch<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    install_hook();
    let was = QUIET.with(|s| s.replace(true));
    let result = std::panic::catch_unwind(AssertUnwindSafe(f));
    QUIET.with(|s| s.set(was));
    result.map_err(|payload| message(payload.as_ref()))
}

/// Run `f` with panics on this thread kept quiet (for code whose unwinding
/// is caught elsewhere, such as a polled future).
pub fn quietly<T>(f: impl FnOnce() -> T) -> T {
    install_hook();
    let was = QUIET.with(|s| s.replace(true));
    let out = f();
    QUIET.with(|s| s.set(was));
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn panics_become_their_message() {
        assert_eq!(super::catch(|| 7), Ok(7));
        let caught = super::catch(|| -> u8 { panic!("boom {}", 3) });
        assert_eq!(caught, Err("boom 3".to_string()));
    }
}
