//! TLS (`rediss://`) on real redis-servers that listen on a TLS port only, so every
//! connection the client opens (commands, pub/sub, sentinel discovery, cluster nodes)
//! must speak TLS for a test to pass. Certificates are made per test with the `openssl`
//! command-line tool: a CA, a server certificate for 127.0.0.1 and localhost, a client
//! certificate, and an unrelated CA.
//!
//! Run with `cargo test --features tls-rustls --test tls`.

#![cfg(feature = "tls-rustls")]

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::cluster_setup::{form_cluster, ClusterNode};
use common::{free_port, redis_server_bin, RedisServer};
use redis_rlock::{Client, ClientBuilder, Error, ReplicaSync};

/// Certificates in a temporary directory, removed on drop.
struct Certs {
    dir: PathBuf,
}

impl Certs {
    fn make() -> Certs {
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let dir = std::env::temp_dir().join(format!(
            "rlock-tls-{}-{}",
            std::process::id(),
            SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let certs = Certs { dir };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        for ca in ["ca", "other-ca"] {
            certs.openssl(
                &[&["req", "-x509"][..], &ec, &["-days", "1"]].concat(),
                &[
                    "-keyout",
                    &format!("{ca}.key"),
                    "-out",
                    &format!("{ca}.crt"),
                    "-subj",
                    &format!("/CN=rlock {ca}"),
                ],
            );
        }
        for (leaf, ext) in [
            // clientAuth too: cluster nodes and sentinels present it to each other.
            (
                "server",
                "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n",
            ),
            ("client", "extendedKeyUsage=clientAuth\n"),
        ] {
            std::fs::write(certs.path(&format!("{leaf}.ext")), ext).unwrap();
            certs.openssl(
                &[&["req"][..], &ec].concat(),
                &[
                    "-keyout",
                    &format!("{leaf}.key"),
                    "-out",
                    &format!("{leaf}.csr"),
                    "-subj",
                    &format!("/CN=rlock {leaf}"),
                ],
            );
            certs.openssl(
                &[
                    "x509",
                    "-req",
                    "-CA",
                    "ca.crt",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                ],
                &[
                    "-days",
                    "1",
                    "-in",
                    &format!("{leaf}.csr"),
                    "-out",
                    &format!("{leaf}.crt"),
                    "-extfile",
                    &format!("{leaf}.ext"),
                ],
            );
        }
        certs
    }

    fn openssl(&self, a: &[&str], b: &[&str]) {
        let out = Command::new("openssl")
            .args(a)
            .args(b)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| {
                panic!("openssl not found ({e}); Debian: `sudo apt-get install -y openssl`")
            });
        assert!(
            out.status.success(),
            "openssl {a:?} {b:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }

    fn pem(&self, name: &str) -> Vec<u8> {
        std::fs::read(self.path(name)).unwrap()
    }

    /// redis-server (or sentinel) arguments for its TLS port, with this CA and server
    /// certificate; `auth_clients` turns mutual TLS on.
    fn server_args(&self, auth_clients: bool) -> Vec<String> {
        let p = |n: &str| self.path(n).display().to_string();
        vec![
            "--tls-cert-file".into(),
            p("server.crt"),
            "--tls-key-file".into(),
            p("server.key"),
            "--tls-ca-cert-file".into(),
            p("ca.crt"),
            "--tls-auth-clients".into(),
            if auth_clients { "yes" } else { "no" }.into(),
        ]
    }

    fn start_server(&self, auth_clients: bool, extra: &[&str]) -> RedisServer {
        let mut args = self.server_args(auth_clients);
        args.extend(extra.iter().map(|s| s.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        RedisServer::start_tls(&args)
    }

    /// A plain redis-rs connection over TLS for checking state, with the client
    /// certificate (servers that do not ask for it ignore it).
    fn admin(&self, port: u16) -> redis::Connection {
        let certs = redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: self.pem("client.crt"),
                client_key: self.pem("client.key"),
            }),
            root_cert: Some(self.pem("ca.crt")),
        };
        redis::Client::build_with_tls(format!("rediss://127.0.0.1:{port}"), certs)
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(2))
            .expect("admin connection over TLS")
    }
}

impl Drop for Certs {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn url(server: &RedisServer) -> String {
    format!("rediss://127.0.0.1:{}", server.port)
}

fn quick(b: ClientBuilder) -> ClientBuilder {
    b.connect_timeout(Duration::from_secs(2))
        .response_timeout(Duration::from_secs(2))
}

fn numsub(admin: &mut redis::Connection, channel: &str) -> i64 {
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("NUMSUB")
        .arg(channel)
        .query(admin)
        .unwrap();
    n
}

fn sharded_numsub(admin: &mut redis::Connection, channel: &str) -> i64 {
    let (_, n): (String, i64) = redis::cmd("PUBSUB")
        .arg("SHARDNUMSUB")
        .arg(channel)
        .query(admin)
        .unwrap();
    n
}

/// `holder` takes `name` with the watchdog (a 30 s lease), a task of `waiter` (another
/// client, so the release is published, not handed over) waits for it, and once the
/// waiter is subscribed (`subscribed` says so) the holder unlocks. Checks the waiter is
/// served well within the lease, which only the pub/sub message can do.
async fn waiter_is_woken(
    holder: &Client,
    waiter: &Client,
    name: &str,
    mut subscribed: impl FnMut() -> bool,
) {
    let guard = holder.lock(name).lock().await.unwrap();
    let lock = waiter.lock(name);
    let task = tokio::spawn(async move {
        let g = lock
            .try_lock_for(Duration::from_secs(20), None)
            .await
            .unwrap()
            .expect("the waiter got the lock");
        let served = Instant::now();
        g.unlock().await.unwrap();
        served
    });
    assert!(
        common::eventually(Duration::from_secs(10), &mut subscribed).await,
        "the waiter never subscribed"
    );
    let released = Instant::now();
    guard.unlock().await.unwrap();
    let served = tokio::time::timeout(Duration::from_secs(20), task)
        .await
        .expect("waiter finished")
        .unwrap();
    let wake = served.duration_since(released);
    println!("FIGURE tls_wake_ms {}", wake.as_millis());
    assert!(
        wake < Duration::from_secs(3),
        "the waiter took {wake:?}: woken by the TTL, not by pub/sub"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn locks_and_pubsub_wake_ups_run_over_tls_with_a_custom_ca() {
    let certs = Certs::make();
    let server = certs.start_server(false, &[]);
    let ca = certs.pem("ca.crt");
    let a = quick(Client::builder(url(&server)).tls_root_cert(&ca))
        .build()
        .await
        .unwrap();
    let b = quick(Client::builder(url(&server)).tls_root_cert(&ca))
        .build()
        .await
        .unwrap();

    let lock = a.lock("tls:a");
    let outer = lock.lock().await.unwrap();
    let inner = lock.lock().await.unwrap();
    assert_eq!(lock.hold_count().await.unwrap(), 2);
    assert!(b.lock("tls:a").try_lock().await.unwrap().is_none());
    inner.unlock().await.unwrap();
    outer.unlock().await.unwrap();
    assert!(!lock.is_locked().await.unwrap());

    let mut admin = certs.admin(server.port);
    let channel = redis_rlock::protocol::channel_name("tls:w");
    waiter_is_woken(&a, &b, "tls:w", || numsub(&mut admin, &channel) == 1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_needs_the_client_certificate() {
    let certs = Certs::make();
    let server = certs.start_server(true, &[]);
    let (ca, cert, key) = (
        certs.pem("ca.crt"),
        certs.pem("client.crt"),
        certs.pem("client.key"),
    );
    let build = || {
        quick(Client::builder(url(&server)))
            .tls_root_cert(&ca)
            .tls_client_cert(&cert, &key)
            .build()
    };
    let (a, b) = (build().await.unwrap(), build().await.unwrap());
    let g = a.lock("mtls:a").lock().await.unwrap();
    assert!(b.lock("mtls:a").is_locked().await.unwrap());
    g.unlock().await.unwrap();
    let mut admin = certs.admin(server.port);
    let channel = redis_rlock::protocol::channel_name("mtls:w");
    waiter_is_woken(&a, &b, "mtls:w", || numsub(&mut admin, &channel) == 1).await;

    // Without a client certificate the server ends the session: typed, and quickly.
    let started = Instant::now();
    let refused = tokio::time::timeout(
        Duration::from_secs(10),
        quick(Client::builder(url(&server)).tls_root_cert(&ca)).build(),
    )
    .await
    .expect("build returned");
    let err = refused.expect_err("a client without certificate was accepted");
    println!("no client certificate: {err}");
    assert!(
        matches!(err, Error::InvalidConfig(_)),
        "expected InvalidConfig, got {err:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(8));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acl_user_with_a_password_works_over_tls() {
    let certs = Certs::make();
    let server = certs.start_server(false, &[]);
    let mut admin = certs.admin(server.port);
    let _: () = redis::cmd("ACL")
        .arg(&["SETUSER", "locker", "on", ">s3cret", "~*", "&*", "+@all"])
        .query(&mut admin)
        .unwrap();
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "admin-pw"])
        .query(&mut admin)
        .unwrap();
    let ca = certs.pem("ca.crt");
    let user_url = format!("rediss://locker:s3cret@127.0.0.1:{}", server.port);
    let a = quick(Client::builder(&user_url).tls_root_cert(&ca))
        .build()
        .await
        .unwrap();
    let b = quick(Client::builder(&user_url).tls_root_cert(&ca))
        .build()
        .await
        .unwrap();
    let g = a.lock("acl:a").lock().await.unwrap();
    assert!(b.lock("acl:a").is_locked().await.unwrap());
    g.unlock().await.unwrap();
    // The admin connection authenticated before requirepass was set and stays so.
    let channel = redis_rlock::protocol::channel_name("acl:w");
    waiter_is_woken(&a, &b, "acl:w", || numsub(&mut admin, &channel) == 1).await;

    let wrong = format!("rediss://locker:nope@127.0.0.1:{}", server.port);
    let err = quick(Client::builder(&wrong).tls_root_cert(&ca))
        .build()
        .await
        .expect_err("a wrong password was accepted");
    assert!(matches!(err, Error::AuthFailed { .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_or_unusable_settings_fail_at_build_typed_and_quickly() {
    let certs = Certs::make();
    let server = certs.start_server(false, &[]);

    // A server certificate no trusted CA signed: the system's roots, then another CA.
    for other in [None, Some(certs.pem("other-ca.crt"))] {
        let mut b = quick(Client::builder(url(&server)));
        if let Some(pem) = &other {
            b = b.tls_root_cert(pem);
        }
        let started = Instant::now();
        let err = tokio::time::timeout(Duration::from_secs(10), b.build())
            .await
            .expect("build returned")
            .expect_err("an untrusted server was accepted");
        println!("untrusted server ({}): {err}", other.is_some());
        assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
        assert!(!err.is_transient());
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    // Certificates with a plain URL, and PEM that is no certificate.
    let plain = format!("redis://127.0.0.1:{}", server.port);
    let err = Client::builder(&plain)
        .tls_root_cert(certs.pem("ca.crt"))
        .build()
        .await
        .unwrap_err();
    assert!(
        matches!(&err, Error::InvalidConfig(m) if m.contains("rediss://")),
        "{err:?}"
    );
    let err = Client::builder(url(&server))
        .tls_root_cert(
            b"-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n",
        )
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
    let err = Client::builder(url(&server))
        .tls_root_cert(certs.pem("ca.crt"))
        .tls_client_cert(certs.pem("client.crt"), b"not a key")
        .build()
        .await
        .unwrap_err();
    assert!(matches!(err, Error::InvalidConfig(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insecure_urls_skip_the_certificate_check_only_with_their_feature() {
    let certs = Certs::make();
    let server = certs.start_server(false, &[]);
    // No CA given: only `#insecure` lets this client past the server's certificate.
    let insecure = format!("rediss://127.0.0.1:{}/#insecure", server.port);
    let built = quick(Client::builder(&insecure)).build().await;
    #[cfg(feature = "tls-rustls-insecure")]
    {
        let client = built.unwrap();
        let g = client.lock("insecure:a").lock().await.unwrap();
        g.unlock().await.unwrap();
    }
    #[cfg(not(feature = "tls-rustls-insecure"))]
    assert!(
        matches!(&built, Err(Error::InvalidConfig(m)) if m.contains("tls-rustls-insecure")),
        "{built:?}"
    );
}

/// One sentinel, TLS only, watching a TLS-only master on its TLS port.
struct TlsSentinel {
    child: Child,
    port: u16,
    dir: PathBuf,
}

impl TlsSentinel {
    fn start(certs: &Certs, master_port: u16) -> TlsSentinel {
        let port = free_port();
        let dir = certs.path(&format!("sentinel-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        let p = |n: &str| certs.path(n).display().to_string();
        let conf = format!(
            "port 0\ntls-port {port}\nbind 127.0.0.1\ndir {dir}\nlogfile {dir}/log\n\
             tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\ntls-auth-clients no\n\
             tls-replication yes\nsentinel monitor mymaster 127.0.0.1 {master_port} 1\n",
            p("server.crt"),
            p("server.key"),
            p("ca.crt"),
            dir = dir.display(),
        );
        let conf_path = dir.join("sentinel.conf");
        std::fs::write(&conf_path, conf).unwrap();
        let child = Command::new(redis_server_bin())
            .arg(&conf_path)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start redis-server --sentinel");
        let mut s = TlsSentinel { child, port, dir };
        s.wait_for_log("+monitor master", Duration::from_secs(10));
        s
    }

    fn wait_for_log(&mut self, line: &str, limit: Duration) {
        let start = Instant::now();
        let log = self.dir.join("log");
        loop {
            if std::fs::read_to_string(&log).is_ok_and(|l| l.contains(line)) {
                return;
            }
            assert!(
                self.child.try_wait().unwrap().is_none(),
                "sentinel exited; see {}",
                log.display()
            );
            assert!(start.elapsed() < limit, "sentinel never logged `{line}`");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for TlsSentinel {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[cfg(feature = "sentinel")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_discovery_and_the_master_run_over_tls() {
    let certs = Certs::make();
    let master = certs.start_server(false, &[]);
    let sentinel = tokio::task::block_in_place(|| TlsSentinel::start(&certs, master.port));
    let ca = certs.pem("ca.crt");
    let build = || {
        quick(Client::sentinel(
            &[format!("rediss://127.0.0.1:{}", sentinel.port)],
            "mymaster",
        ))
        .tls_root_cert(&ca)
        .replica_sync(ReplicaSync::Off)
        .build()
    };
    let (a, b) = (build().await.unwrap(), build().await.unwrap());
    let g = a.lock("sn-tls:a").lock().await.unwrap();
    let mut admin = certs.admin(master.port);
    let exists: i64 = redis::cmd("EXISTS")
        .arg("sn-tls:a")
        .query(&mut admin)
        .unwrap();
    assert_eq!(exists, 1, "the lock is on the master");
    g.unlock().await.unwrap();
    let channel = redis_rlock::protocol::channel_name("sn-tls:w");
    waiter_is_woken(&a, &b, "sn-tls:w", || numsub(&mut admin, &channel) == 1).await;
}

/// Three TLS-only masters (no replicas) with a TLS cluster bus, made into one cluster.
#[cfg(feature = "cluster")]
fn tls_cluster(certs: &Certs) -> Vec<RedisServer> {
    let (nodes, spec): (Vec<RedisServer>, Vec<ClusterNode>) = (0..3)
        .map(|_| {
            let bus_port = free_port();
            let bus = bus_port.to_string();
            let node = certs.start_server(
                false,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-port",
                    &bus,
                    "--cluster-node-timeout",
                    "1000",
                    "--tls-cluster",
                    "yes",
                    "--tls-replication",
                    "yes",
                ],
            );
            let spec = ClusterNode {
                port: node.port,
                bus_port,
            };
            (node, spec)
        })
        .unzip();
    form_cluster(&spec, 0, |port| certs.admin(port));
    let start = Instant::now();
    for n in &nodes {
        let mut admin = certs.admin(n.port);
        loop {
            let info: String = redis::cmd("CLUSTER").arg("INFO").query(&mut admin).unwrap();
            if info.contains("cluster_state:ok") {
                break;
            }
            assert!(start.elapsed() < Duration::from_secs(20), "cluster not ok");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    nodes
}

#[cfg(feature = "cluster")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_nodes_and_sharded_pubsub_run_over_tls() {
    let certs = Certs::make();
    let nodes = tokio::task::block_in_place(|| tls_cluster(&certs));
    let seeds: Vec<String> = nodes.iter().map(url).collect();
    let ca = certs.pem("ca.crt");
    let build = || {
        quick(Client::cluster(&seeds))
            .tls_root_cert(&ca)
            .replica_sync(ReplicaSync::Off)
            .build()
    };
    let (a, b) = (build().await.unwrap(), build().await.unwrap());
    // Names in every slot range, so that each node is reached.
    for i in 0..12 {
        let lock = a.lock(format!("cl-tls:{i}"));
        let g = lock.lock().await.unwrap();
        assert!(b.lock(format!("cl-tls:{i}")).is_locked().await.unwrap());
        g.unlock().await.unwrap();
    }
    let channel = redis_rlock::protocol::channel_name("cl-tls:w");
    let mut admins: Vec<redis::Connection> = nodes.iter().map(|n| certs.admin(n.port)).collect();
    waiter_is_woken(&a, &b, "cl-tls:w", || {
        admins
            .iter_mut()
            .map(|c| sharded_numsub(c, &channel) + numsub(c, &channel))
            .sum::<i64>()
            == 1
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn valkeys_urls_run_over_tls_as_rediss_ones() {
    let certs = Certs::make();
    let server = certs.start_server(false, &[]);
    let ca = certs.pem("ca.crt");
    let valkeys = url(&server).replace("rediss://", "valkeys://");
    let c = quick(Client::builder(&valkeys).tls_root_cert(&ca))
        .build()
        .await
        .unwrap();
    let g = c.lock("tls:valkeys").lock().await.unwrap();
    assert_eq!(c.lock("tls:valkeys").hold_count().await.unwrap(), 1);
    g.unlock().await.unwrap();
    // Certificates with a plain `valkey://` URL would mean no TLS at all: refused.
    let plain = valkeys.replace("valkeys://", "valkey://");
    assert!(matches!(
        quick(Client::builder(&plain).tls_root_cert(&ca)).build().await,
        Err(Error::InvalidConfig(m)) if m.contains("valkeys://")
    ));
}
