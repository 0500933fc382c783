//! The global allocator, and how soon a long-running process gives freed memory back.
//!
//! mimalloc returns freed memory to the system where glibc's malloc kept the operator's
//! resident memory at its high-water mark after a burst (many clusters created at once). Its
//! defaults still keep freed pages for a second and two empty pages per size class and
//! thread; an operator's working set is small and its bursts are rare, so the long-running
//! commands give them back at once.
//!
//! The options must be set before mimalloc initializes: it makes its first arena and the main
//! thread's heap then, and reads the arena option and the page retention once for each. That
//! happens in its own load-time constructor, before `main`. So the setting is itself a
//! load-time hook, ordered before mimalloc's ([`BEFORE_MIMALLOC_STARTS`]). Measured at 200
//! clusters by `tests/scale.rs`: 72 MiB without the options, 68 MiB with them set in `main`,
//! 57 MiB with them set before mimalloc starts.

use std::ffi::{CStr, c_char, c_int, c_long};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The subcommands that run for days (clap's names of `Command::Run` and `Command::Kubelet`).
pub const LONG_RUNNING: [&str; 2] = ["run", "kubelet"];

// Numbers in `mi_option_e` of the mimalloc that `libmimalloc-sys` vendors (v3, `mimalloc.h`);
// the tests below hold them to mimalloc's own reading of its environment variables.
const ARENA_EAGER_COMMIT: c_int = 4;
const PURGE_DELAY: c_int = 15;
const PAGE_FULL_RETAIN: c_int = 36;

/// (option, its environment variable, the value a long-running process uses)
const EAGER_RETURN: [(c_int, &CStr, c_long); 3] = [
    (PURGE_DELAY, c"MIMALLOC_PURGE_DELAY", 0),
    (PAGE_FULL_RETAIN, c"MIMALLOC_PAGE_FULL_RETAIN", 0),
    (ARENA_EAGER_COMMIT, c"MIMALLOC_ARENA_EAGER_COMMIT", 0),
];

unsafe extern "C" {
    fn mi_option_set(option: c_int, value: c_long);
    fn getenv(name: *const c_char) -> *const c_char;
}

/// Freed memory goes back to the system at once. An option set in the environment wins.
/// Allocates nothing (it runs before the allocator starts) and must run single-threaded
/// (mimalloc's option setter is not thread-safe).
#[cfg_attr(not(all(target_os = "linux", target_env = "gnu")), allow(dead_code))]
fn return_memory_eagerly() {
    for (option, variable, value) in EAGER_RETURN {
        // SAFETY: `getenv` reads the environment glibc set up before any constructor ran;
        // `mi_option_set` is a plain setter of mimalloc's option table. Both run while the
        // process has one thread.
        unsafe {
            if getenv(variable.as_ptr()).is_null() {
                mi_option_set(option, value);
            }
        }
    }
}

/// glibc calls each `.init_array` entry with the process's arguments, before `main` and in
/// the order of their sections' numbers: std's own (99) has stored the arguments and
/// allocated nothing; mimalloc's constructor is unnumbered as gcc builds it (after every
/// numbered one) and 101 under clang. 100 runs between them.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[used]
#[unsafe(link_section = ".init_array.00100")]
static BEFORE_MIMALLOC_STARTS: extern "C" fn(c_int, *const *const c_char, *const *const c_char) =
    before_mimalloc_starts;

#[cfg(all(target_os = "linux", target_env = "gnu"))]
extern "C" fn before_mimalloc_starts(
    argc: c_int,
    argv: *const *const c_char,
    _envp: *const *const c_char,
) {
    if argc < 2 || argv.is_null() {
        return;
    }
    // SAFETY: glibc passes `argc` valid, NUL-terminated arguments; the second exists.
    let command = unsafe { *argv.add(1) };
    if command.is_null() {
        return;
    }
    // SAFETY: as above.
    let command = unsafe { CStr::from_ptr(command) }.to_bytes();
    if LONG_RUNNING.iter().any(|c| c.as_bytes() == command) {
        return_memory_eagerly();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    unsafe extern "C" {
        fn mi_option_get(option: c_int) -> c_long;
    }

    fn option(option: c_int) -> c_long {
        // SAFETY: a plain getter of mimalloc's option table.
        unsafe { mi_option_get(option) }
    }

    fn variable(name: &CStr) -> &str {
        name.to_str().expect("ASCII")
    }

    const CHILD: &str = "MO_TEST_MIMALLOC_CHILD";

    /// This test binary run again with `args`, none of the options in its environment.
    fn child(args: &[&str]) -> Command {
        let mut child = Command::new(std::env::current_exe().expect("test binary"));
        child.args(args).env(CHILD, "1");
        for (_, name, _) in EAGER_RETURN {
            child.env_remove(variable(name));
        }
        child
    }

    /// Run in a child process whose environment sets each option to a distinct value: the
    /// value mimalloc read from `MIMALLOC_<NAME>` must be the one our number reads back.
    #[test]
    fn the_option_numbers_are_the_ones_mimalloc_reads_from_its_environment() {
        if std::env::var_os(CHILD).is_some() {
            for (i, (number, name, _)) in EAGER_RETURN.into_iter().enumerate() {
                assert_eq!(option(number), 700 + i as c_long, "{}", variable(name));
            }
            return;
        }
        let mut child = child(&[
            "allocator::tests::the_option_numbers_are_the_ones_mimalloc_reads_from_its_environment",
            "--exact",
            "--nocapture",
        ]);
        for (i, (_, name, _)) in EAGER_RETURN.into_iter().enumerate() {
            child.env(variable(name), (700 + i).to_string());
        }
        let out = child.output().expect("child test");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The option values mimalloc prints when it starts (`MIMALLOC_VERBOSE`), in a child
    /// whose first argument is `command` (to the test harness, a filter that selects nothing).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    fn options_at_start(command: &str) -> String {
        let out = child(&[command, "--exact", "no test has this name"])
            .env("MIMALLOC_VERBOSE", "1")
            .output()
            .expect("child");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// mimalloc prints its options at the end of its own start; in a long-running command
    /// they already read 0 then, so they were set before it made its first arena and the main
    /// thread's heap. Any other command starts with mimalloc's defaults.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[test]
    fn a_long_running_command_sets_the_options_before_mimalloc_starts() {
        const NAMES: [(c_int, &str); 3] = [
            (PURGE_DELAY, "purge_delay"),
            (PAGE_FULL_RETAIN, "page_full_retain"),
            (ARENA_EAGER_COMMIT, "arena_eager_commit"),
        ];
        if std::env::var_os(CHILD).is_some() {
            return;
        }
        for command in LONG_RUNNING {
            let printed = options_at_start(command);
            for (number, name) in NAMES {
                let (_, _, value) = EAGER_RETURN.iter().find(|(n, ..)| *n == number).unwrap();
                assert!(
                    printed.contains(&format!("option '{name}': {value} ")),
                    "{command}: {name} is not {value} when mimalloc starts:\n{printed}"
                );
            }
        }
        let printed = options_at_start("bench");
        for (_, name) in NAMES {
            assert!(
                printed.contains(&format!("option '{name}': "))
                    && !printed.contains(&format!("option '{name}': 0 ")),
                "bench: {name} is not left at mimalloc's default:\n{printed}"
            );
        }
    }

    #[test]
    fn a_long_running_process_returns_memory_at_once_unless_its_environment_says_otherwise() {
        if std::env::var_os(CHILD).is_some() {
            return;
        }
        let unset: Vec<_> = EAGER_RETURN
            .iter()
            .filter(|(_, name, _)| std::env::var_os(variable(name)).is_none())
            .collect();
        return_memory_eagerly();
        for (number, name, value) in unset {
            assert_eq!(option(*number), *value, "{}", variable(name));
        }
    }
}
