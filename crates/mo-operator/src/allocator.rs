//! The global allocator, and how soon a long-running process gives freed memory back.
//!
//! mimalloc returns freed memory to the system where glibc's malloc kept the operator's
//! resident memory at its high-water mark after a burst (many clusters created at once). Its
//! defaults still keep freed pages for a second and two empty pages per size class and
//! thread; an operator's working set is small and its bursts are rare, so it gives them back
//! at once. Measured at 200 clusters by `tests/scale.rs`: 72 MiB without, 57 MiB with the
//! three options in the environment, 68 MiB with them set by [`return_memory_eagerly`] alone:
//! mimalloc makes its first arena before `main` and reads the arena option then, and the main
//! thread keeps the page retention it started with. The chart sets all three in the
//! environment; the setting here covers the threads and arenas made later.

use std::ffi::{c_int, c_long};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

// Numbers in `mi_option_e` of the mimalloc that `libmimalloc-sys` vendors (v3, `mimalloc.h`);
// the test below holds them to mimalloc's own reading of its environment variables.
const ARENA_EAGER_COMMIT: c_int = 4;
const PURGE_DELAY: c_int = 15;
const PAGE_FULL_RETAIN: c_int = 36;

/// (option, its environment variable, the value a long-running process uses)
const EAGER_RETURN: [(c_int, &str, c_long); 3] = [
    (PURGE_DELAY, "MIMALLOC_PURGE_DELAY", 0),
    (PAGE_FULL_RETAIN, "MIMALLOC_PAGE_FULL_RETAIN", 0),
    (ARENA_EAGER_COMMIT, "MIMALLOC_ARENA_EAGER_COMMIT", 0),
];

unsafe extern "C" {
    fn mi_option_set(option: c_int, value: c_long);
}

/// Freed memory goes back to the system at once. An option set in the environment wins.
/// Call before other threads start (mimalloc's option setter is not thread-safe).
pub fn return_memory_eagerly() {
    for (option, variable, value) in EAGER_RETURN {
        if std::env::var_os(variable).is_none() {
            // SAFETY: a plain setter of mimalloc's option table, called while single-threaded.
            unsafe { mi_option_set(option, value) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" {
        fn mi_option_get(option: c_int) -> c_long;
    }

    fn option(option: c_int) -> c_long {
        // SAFETY: a plain getter of mimalloc's option table.
        unsafe { mi_option_get(option) }
    }

    const CHILD: &str = "MO_TEST_MIMALLOC_CHILD";

    /// Run in a child process whose environment sets each option to a distinct value: the
    /// value mimalloc read from `MIMALLOC_<NAME>` must be the one our number reads back.
    #[test]
    fn the_option_numbers_are_the_ones_mimalloc_reads_from_its_environment() {
        if std::env::var_os(CHILD).is_some() {
            for (i, (number, variable, _)) in EAGER_RETURN.into_iter().enumerate() {
                assert_eq!(option(number), 700 + i as c_long, "{variable}");
            }
            return;
        }
        let mut child = std::process::Command::new(std::env::current_exe().expect("test binary"));
        child
            .args([
                "allocator::tests::the_option_numbers_are_the_ones_mimalloc_reads_from_its_environment",
                "--exact",
                "--nocapture",
            ])
            .env(CHILD, "1");
        for (i, (_, variable, _)) in EAGER_RETURN.into_iter().enumerate() {
            child.env(variable, (700 + i).to_string());
        }
        let out = child.output().expect("child test");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn a_long_running_process_returns_memory_at_once_unless_its_environment_says_otherwise() {
        if std::env::var_os(CHILD).is_some() {
            return;
        }
        let unset: Vec<_> = EAGER_RETURN
            .iter()
            .filter(|(_, variable, _)| std::env::var_os(variable).is_none())
            .collect();
        return_memory_eagerly();
        for (number, variable, value) in unset {
            assert_eq!(option(*number), *value, "{variable}");
        }
    }
}
