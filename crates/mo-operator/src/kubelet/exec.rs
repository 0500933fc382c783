//! `mo-operator kubelet-exec`: how the process runtime starts a container. The kubelet runs
//! this binary again (`/proc/self/exe`) with a [`Launch`]; being a fresh, single-threaded
//! process it can set namespaces up with ordinary calls before it executes the container's
//! command (no work between `fork` and `exec` in the multi-threaded kubelet).
//!
//! A container gets new mount, PID and UTS namespaces: `/` is made private, the image's files
//! and the pod's volumes are bind-mounted, the hostname is the pod's, and the command runs as
//! PID 1 of its PID namespace with a fresh `/proc`, as in a container. The launcher stays as
//! its parent: it forwards signals to it and exits with its status (128 + signal when it was
//! killed). When the launcher dies (the kubelet killed it, or the kubelet died and
//! `PR_SET_PDEATHSIG` killed the launcher), PID 1 gets SIGKILL and the kernel kills every
//! process of the container: nothing is left behind.

use nix::mount::{MsFlags, mount};
use nix::sched::{CloneFlags, setns, unshare};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{WaitStatus, waitpid};
use nix::unistd::{ForkResult, execve, fork};
use serde::{Deserialize, Serialize};
use std::ffi::CString;
use std::io::{self, Write as _};
use std::net::SocketAddr;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Mutex, mpsc};
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// What to run: a JSON [`Launch`], or `@FILE` holding one (read, then removed).
    pub launch: String,
}

/// A process and its environment.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Process {
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: Option<String>,
}

/// A bind mount in the container's mount namespace.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub source: PathBuf,
    pub target: PathBuf,
    pub read_only: bool,
}

/// What the launcher does.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum Launch {
    /// A container: new namespaces, the binds (in order), the command as PID 1.
    Container {
        hostname: String,
        binds: Vec<Bind>,
        process: Process,
    },
    /// A command inside the mount and UTS namespaces of a running container's launcher
    /// (exec probes, exec hooks).
    Join { pid: u32, process: Process },
    /// An HTTP GET (an `httpGet` lifecycle hook): exit 0 on a 2xx or 3xx answer.
    HttpGet {
        addr: SocketAddr,
        host: String,
        path: String,
        headers: Vec<(String, String)>,
        timeout_ms: u64,
    },
    /// A `sleep` lifecycle hook.
    Sleep { seconds: u64 },
}

/// Launch specs longer than this go through a file (an argument is at most 128 KiB).
const INLINE_LIMIT: usize = 64 * 1024;

/// The launcher's command for `launch`: this executable, killed when the thread that spawns
/// it ends (spawn long-lived ones from a [`Spawner`]), in a process group of its own.
pub fn command(launch: &Launch) -> io::Result<std::process::Command> {
    let json = serde_json::to_string(launch).map_err(io::Error::other)?;
    let arg = if json.len() > INLINE_LIMIT {
        let file = std::env::temp_dir().join(format!(
            "mo-kubelet-launch-{}-{}.json",
            std::process::id(),
            NEXT_FILE.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::write(&file, json)?;
        format!("@{}", file.display())
    } else {
        json
    };
    // /proc/self/exe: still this program when its file was replaced by a rebuild.
    let mut command = std::process::Command::new("/proc/self/exe");
    command
        .arg0("mo-operator")
        .arg("kubelet-exec")
        .arg(arg)
        .stdin(std::process::Stdio::null())
        .process_group(0);
    let parent = nix::unistd::getpid();
    // SAFETY: prctl and getppid are async-signal-safe and allocate nothing.
    unsafe {
        command.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The kubelet died before the line above: no one would ever kill us.
            if nix::unistd::getppid() != parent {
                return Err(io::Error::other("the kubelet is gone"));
            }
            Ok(())
        });
    }
    Ok(command)
}

static NEXT_FILE: AtomicI32 = AtomicI32::new(0);

type SpawnRequest = (
    std::process::Command,
    mpsc::Sender<io::Result<std::process::Child>>,
);

/// Spawns processes from one thread that lives as long as the kubelet: `PR_SET_PDEATHSIG`
/// fires when the spawning *thread* ends, and the runtime's worker threads come and go.
pub struct Spawner {
    requests: Mutex<mpsc::Sender<SpawnRequest>>,
}

impl Spawner {
    pub fn new() -> io::Result<Spawner> {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("kubelet-spawner".into())
            .spawn(move || {
                for (mut command, reply) in rx {
                    let _ = reply.send(command.spawn());
                }
            })?;
        Ok(Spawner {
            requests: Mutex::new(tx),
        })
    }

    pub fn spawn(&self, command: std::process::Command) -> io::Result<std::process::Child> {
        let (tx, rx) = mpsc::channel();
        self.requests
            .lock()
            .expect("spawner lock")
            .send((command, tx))
            .map_err(|_| io::Error::other("spawner thread gone"))?;
        rx.recv()
            .map_err(|_| io::Error::other("spawner thread gone"))?
    }
}

/// The launcher's entry point; returns the exit code (when it did not become the command).
pub fn main(args: &Args) -> i32 {
    let launch = match read_launch(&args.launch) {
        Ok(l) => l,
        Err(e) => {
            eprintln!("kubelet-exec: {e}");
            return 128;
        }
    };
    let result = match launch {
        Launch::Container {
            hostname,
            binds,
            process,
        } => container(&hostname, &binds, &process),
        Launch::Join { pid, process } => join(pid, &process),
        Launch::HttpGet {
            addr,
            host,
            path,
            headers,
            timeout_ms,
        } => {
            match super::probe::http_get(
                addr,
                &host,
                &path,
                &headers,
                Duration::from_millis(timeout_ms),
            ) {
                Ok(code) if (200..400).contains(&code) => Ok(0),
                Ok(code) => Err((1, format!("GET http://{addr}{path}: HTTP {code}"))),
                Err(e) => Err((1, format!("GET http://{addr}{path}: {e}"))),
            }
        }
        Launch::Sleep { seconds } => {
            std::thread::sleep(Duration::from_secs(seconds));
            Ok(0)
        }
    };
    match result {
        Ok(code) => code,
        Err((code, message)) => {
            let _ = writeln!(io::stderr(), "kubelet-exec: {message}");
            code
        }
    }
}

fn read_launch(arg: &str) -> Result<Launch, String> {
    let text = match arg.strip_prefix('@') {
        Some(file) => {
            let text = std::fs::read_to_string(file).map_err(|e| format!("{file}: {e}"))?;
            let _ = std::fs::remove_file(file);
            text
        }
        None => arg.to_string(),
    };
    serde_json::from_str(&text).map_err(|e| format!("bad launch spec: {e}"))
}

/// An error and the exit code it ends the launcher with.
type Failure = (i32, String);

fn setup(what: &str) -> impl Fn(nix::Error) -> Failure + '_ {
    move |e| (128, format!("{what}: {e}"))
}

/// The signals a container's PID 1 receives through its launcher.
const FORWARDED: [Signal; 7] = [
    Signal::SIGTERM,
    Signal::SIGINT,
    Signal::SIGHUP,
    Signal::SIGQUIT,
    Signal::SIGUSR1,
    Signal::SIGUSR2,
    Signal::SIGWINCH,
];

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(signal: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe {
            libc::kill(pid, signal);
        }
    }
}

fn container(hostname: &str, binds: &[Bind], process: &Process) -> Result<i32, Failure> {
    unshare(CloneFlags::CLONE_NEWNS | CloneFlags::CLONE_NEWPID | CloneFlags::CLONE_NEWUTS)
        .map_err(setup("unshare"))?;
    // Nothing mounted here reaches the host (nor the other containers).
    mount(
        None::<&str>,
        "/",
        None::<&str>,
        MsFlags::MS_REC | MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(setup("making / private"))?;
    nix::unistd::sethostname(hostname).map_err(setup("sethostname"))?;
    for b in binds {
        bind(b)?;
    }
    let prepared = Prepared::new(process)?;
    let mut forwarded = SigSet::empty();
    for s in FORWARDED {
        forwarded.add(s);
    }
    let mut old = SigSet::empty();
    // Held until the forwarding handler is in place: a SIGTERM is forwarded, never lost.
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&forwarded), Some(&mut old))
        .map_err(setup("sigprocmask"))?;
    // SAFETY: this process is single-threaded (the launcher starts no threads).
    match unsafe { fork() }.map_err(setup("fork"))? {
        ForkResult::Child => {
            // PID 1 of the container: it dies with the launcher.
            let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGKILL);
            // Its own /proc, showing the container's processes.
            let _ = mount(
                Some("proc"),
                "/proc",
                Some("proc"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None::<&str>,
            );
            let _ = nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old), None);
            let (code, message) = prepared.exec();
            let _ = writeln!(io::stderr(), "kubelet-exec: {message}");
            // SAFETY: leaves at once, without running the parent's exit handlers.
            unsafe { libc::_exit(code) }
        }
        ForkResult::Parent { child } => {
            CHILD.store(child.as_raw(), Ordering::Relaxed);
            let action = SigAction::new(
                SigHandler::Handler(forward),
                SaFlags::SA_RESTART,
                SigSet::empty(),
            );
            for s in FORWARDED {
                // SAFETY: the handler only calls kill.
                unsafe { nix::sys::signal::sigaction(s, &action) }.map_err(setup("sigaction"))?;
            }
            nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&old), None)
                .map_err(setup("sigprocmask"))?;
            loop {
                match waitpid(child, None) {
                    Ok(WaitStatus::Exited(_, code)) => return Ok(code),
                    Ok(WaitStatus::Signaled(_, signal, _)) => return Ok(128 + signal as i32),
                    Ok(_) | Err(nix::errno::Errno::EINTR) => continue,
                    Err(e) => return Err((128, format!("waitpid: {e}"))),
                }
            }
        }
    }
}

/// Enters the namespaces of a container's launcher and becomes the command.
fn join(pid: u32, process: &Process) -> Result<i32, Failure> {
    // Both opened first: once in the container's mount namespace, /proc is the container's.
    let mut namespaces = Vec::new();
    for (name, flag) in [
        ("uts", CloneFlags::CLONE_NEWUTS),
        ("mnt", CloneFlags::CLONE_NEWNS),
    ] {
        let path = format!("/proc/{pid}/ns/{name}");
        let file = std::fs::File::open(&path).map_err(|e| (128, format!("{path}: {e}")))?;
        namespaces.push((file, flag));
    }
    for (file, flag) in &namespaces {
        setns(file, *flag).map_err(setup("setns"))?;
    }
    let prepared = Prepared::new(process)?;
    Err(prepared.exec())
}

/// Bind-mounts `b.source` at `b.target`. A missing mount point is created: on the host's
/// root, which the container shares (an empty file or directory is left there).
fn bind(b: &Bind) -> Result<(), Failure> {
    let fail = |what: &str, e: &dyn std::fmt::Display| {
        (
            128,
            format!(
                "mounting {} at {}: {what}: {e}",
                b.source.display(),
                b.target.display()
            ),
        )
    };
    let meta = std::fs::metadata(&b.source).map_err(|e| fail("source", &e))?;
    if meta.is_dir() {
        std::fs::create_dir_all(&b.target).map_err(|e| fail("mount point", &e))?;
    } else {
        if let Some(parent) = b.target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| fail("mount point", &e))?;
        }
        if std::fs::metadata(&b.target).is_err() {
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&b.target)
                .map_err(|e| fail("mount point", &e))?;
        }
    }
    mount(
        Some(&b.source),
        &b.target,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(|e| fail("bind", &e))?;
    if b.read_only {
        mount(
            None::<&str>,
            &b.target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
            None::<&str>,
        )
        .map_err(|e| fail("read-only remount", &e))?;
    }
    Ok(())
}

/// Everything `execve` needs, built before `fork`.
struct Prepared {
    program: CString,
    argv: Vec<CString>,
    env: Vec<CString>,
    dir: CString,
}

fn cstring(s: impl Into<Vec<u8>>) -> Result<CString, Failure> {
    CString::new(s).map_err(|_| (128, "a NUL byte in the command or environment".to_string()))
}

impl Prepared {
    fn new(process: &Process) -> Result<Prepared, Failure> {
        let name = process
            .argv
            .first()
            .ok_or((128, "empty command".to_string()))?;
        let dir = process.working_dir.clone().unwrap_or_else(|| "/".into());
        // As runc: a missing working directory is created.
        std::fs::create_dir_all(&dir).map_err(|e| (128, format!("working dir {dir}: {e}")))?;
        let path = process
            .env
            .iter()
            .find(|(k, _)| k == "PATH")
            .map_or(super::sandbox::DEFAULT_PATH, |(_, v)| v.as_str());
        let program = resolve(name, path, Path::new(&dir)).ok_or_else(|| {
            (
                127,
                format!("exec: {name:?}: executable file not found in $PATH"),
            )
        })?;
        Ok(Prepared {
            program: cstring(program.as_os_str().as_bytes())?,
            argv: process
                .argv
                .iter()
                .map(|a| cstring(a.as_str()))
                .collect::<Result<_, _>>()?,
            env: process
                .env
                .iter()
                .map(|(k, v)| cstring(format!("{k}={v}")))
                .collect::<Result<_, _>>()?,
            dir: cstring(dir)?,
        })
    }

    /// Becomes the command; returns only on failure.
    fn exec(&self) -> Failure {
        if let Err(e) = nix::unistd::chdir(self.dir.as_c_str()) {
            return (128, format!("chdir {:?}: {e}", self.dir));
        }
        let e = match execve(&self.program, &self.argv, &self.env) {
            Ok(never) => match never {},
            Err(e) => e,
        };
        let code = match e {
            nix::errno::Errno::ENOENT => 127,
            nix::errno::Errno::EACCES | nix::errno::Errno::ENOEXEC => 126,
            _ => 128,
        };
        (code, format!("exec {:?}: {e}", self.program))
    }
}

/// The program a command name runs: a path as given, a bare name looked up in `PATH`.
fn resolve(name: &str, path: &str, dir: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt as _;
    let executable = |p: &Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if name.contains('/') {
        let p = dir.join(name);
        return p.exists().then_some(PathBuf::from(name));
    }
    path.split(':')
        .filter(|d| !d.is_empty())
        .map(|d| Path::new(d).join(name))
        .find(|p| executable(p))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_resolve_through_path() {
        assert_eq!(
            resolve("sh", "/nonexistent:/bin:/usr/bin", Path::new("/")),
            Some(PathBuf::from("/bin/sh"))
        );
        assert_eq!(
            resolve("no-such-program-here", "/bin", Path::new("/")),
            None
        );
        assert_eq!(
            resolve("/bin/sh", "", Path::new("/")),
            Some(PathBuf::from("/bin/sh"))
        );
        // A directory on the PATH is not a program.
        assert_eq!(resolve("bin", "/", Path::new("/")), None);
    }

    #[test]
    fn launch_specs_round_trip() {
        let launch = Launch::Container {
            hostname: "web-0".into(),
            binds: vec![Bind {
                source: "/state/x".into(),
                target: "/etc/x".into(),
                read_only: true,
            }],
            process: Process {
                argv: vec!["/bin/sh".into(), "-c".into(), "echo $A".into()],
                env: vec![("A".into(), "1".into())],
                working_dir: None,
            },
        };
        let json = serde_json::to_string(&launch).unwrap();
        assert_eq!(read_launch(&json).unwrap(), launch);
        assert!(read_launch("{").is_err());
    }
}
