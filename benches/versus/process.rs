//! The processes of a run: daemons stopped on drop, ports waited for, and
//! what `/proc` and Redis say a process or a server has spent.

use crate::common::{wait_until, RedisServer};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A child process stopped with SIGTERM (then SIGKILL) when dropped.
pub struct Daemon {
    pub child: Child,
}

impl Daemon {
    pub fn spawn(name: &str, command: &mut Command, dir: &Path) -> Self {
        let log = std::fs::File::create(dir.join(format!("{name}.log"))).expect("log");
        let child = command
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        Self { child }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn wait_for_port(port: u16) {
    wait_until(Duration::from_secs(30), &format!("port {port}"), || {
        TcpStream::connect(("127.0.0.1", port)).is_ok()
    });
}

/// Runs nginx with `config` (one worker) from the prefix directory
/// `prefix` (which gets `nginx.conf` and `logs/`), its log in `dir`; waits
/// for `ports` and the worker. Returns it and the worker's pid.
pub fn run_nginx(
    name: &str,
    prefix: &Path,
    config: &str,
    ports: &[u16],
    dir: &Path,
) -> (Daemon, u32) {
    std::fs::create_dir_all(prefix.join("logs")).expect("mkdir");
    let conf_path = prefix.join("nginx.conf");
    std::fs::write(&conf_path, config).expect("write nginx.conf");
    let daemon = Daemon::spawn(
        name,
        Command::new("nginx")
            .arg("-p")
            .arg(prefix)
            .arg("-c")
            .arg(&conf_path),
        dir,
    );
    for &port in ports {
        wait_for_port(port);
    }
    let master = daemon.child.id();
    let mut worker = None;
    wait_until(Duration::from_secs(10), "the nginx worker", || {
        worker = children_of(master).first().copied();
        worker.is_some()
    });
    (daemon, worker.unwrap_or(master))
}

/// Processes whose parent is `pid`.
pub fn children_of(pid: u32) -> Vec<u32> {
    let mut children = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the command's closing parenthesis: state, ppid, …
        let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
        if after.split_whitespace().nth(1) == Some(&pid.to_string()) {
            children.push(child);
        }
    }
    children
}

/// User + system CPU time of `pid` (all its threads), in clock ticks.
pub fn cpu_ticks(pid: u32) -> u64 {
    let (user, system) = user_and_system_ticks(pid);
    user + system
}

/// User and system CPU time of `pid` (all its threads), in clock ticks.
pub fn user_and_system_ticks(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after.split_whitespace().collect();
    // utime and stime are fields 14 and 15 of stat: 12 and 13 after the ')'.
    let field = |i: usize| fields.get(i).and_then(|v| v.parse::<u64>().ok());
    (field(11).unwrap_or(0), field(12).unwrap_or(0))
}

/// CPUs online on the machine (not this process's affinity, which
/// `--pin` narrows).
pub fn online_cpus() -> usize {
    command_line("getconf", &["_NPROCESSORS_ONLN"])
        .parse()
        .unwrap_or(1)
}

pub fn clock_ticks_per_second() -> f64 {
    command_line("getconf", &["CLK_TCK"])
        .parse()
        .unwrap_or(100.0)
}

/// Context switches of every thread of `pid` so far, voluntary (a thread
/// parked: waiting for a socket, a timer, another thread) and not (taken
/// off its core): what `perf stat -e context-switches` counts.
pub fn context_switches(pid: u32) -> u64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten();
    tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("status")).ok())
        .map(|status| {
            status
                .lines()
                .filter_map(|l| {
                    l.strip_prefix("voluntary_ctxt_switches:")
                        .or_else(|| l.strip_prefix("nonvoluntary_ctxt_switches:"))
                })
                .filter_map(|v| v.trim().parse::<u64>().ok())
                .sum::<u64>()
        })
        .sum()
}

/// System calls of `pid` (every thread) counted by `perf stat` from
/// [`SyscallCount::start`] to [`SyscallCount::stop`]; `None` where perf
/// cannot count them (not installed, or tracepoints not permitted).
pub struct SyscallCount(Option<std::process::Child>);

impl SyscallCount {
    /// Starts counting `pid`'s system calls.
    pub fn start(pid: u32) -> Self {
        let child = Command::new("perf")
            .args(["stat", "-x", ",", "-e", "raw_syscalls:sys_enter", "-p"])
            .arg(pid.to_string())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .ok();
        Self(child)
    }

    /// Stops counting; the system calls made meanwhile.
    pub fn stop(self) -> Option<u64> {
        let child = self.0?;
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let output = child.wait_with_output().ok()?;
        String::from_utf8_lossy(&output.stderr)
            .lines()
            .find(|l| l.contains("raw_syscalls:sys_enter"))
            .and_then(|l| l.split(',').next())
            .and_then(|n| n.trim().parse().ok())
    }
}

/// Decide calls (`EVALSHA`, `EVAL`, `FCALL`) Redis has served so far.
pub fn redis_script_calls(redis: &RedisServer) -> u64 {
    ["evalsha", "eval", "fcall"]
        .iter()
        .map(|command| redis.command_calls(command))
        .sum()
}

pub fn command_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            String::from_utf8_lossy(&text).trim().to_string()
        })
        .unwrap_or_default()
}

pub fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into())
}

// ------------------------------------------------------------ the upstream

/// Pins `pid` (every thread) to `cpus` (a `taskset` list); false if it
/// could not be.
pub fn pin(pid: u32, cpus: &str) -> bool {
    std::process::Command::new("taskset")
        .args(["-a", "-cp", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Gives this process every core again (after a pinned part), so that
/// what it starts next is not confined to one.
pub fn unpin_self() {
    pin(
        std::process::id(),
        &format!("0-{}", online_cpus().max(1) - 1),
    );
}
