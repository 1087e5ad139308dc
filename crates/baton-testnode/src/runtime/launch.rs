//! From a container spec and its image's [`Runner`] to a concrete command
//! line: program, args, environment, working directory, the user to run as,
//! and for Postgres the first-start initialisation its image's entrypoint
//! does.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Container;

use crate::env::expand;
use crate::images::Runner;
use crate::paths::MountTable;

/// Everything needed to start one container process.
#[derive(Clone, Debug)]
pub(crate) struct Launch {
    pub program: String,
    pub args: Vec<String>,
    /// The complete environment (nothing is inherited from the test).
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    /// Run as this OS user instead of root (Postgres refuses root).
    pub user: Option<String>,
    /// Work done before the process starts, as the image's entrypoint
    /// would.
    pub setup: Option<Setup>,
    /// The container's mounts, to translate exec probe and hook commands.
    pub mounts: MountTable,
    /// Host directory → container path, bind-mounted in the process's mount
    /// namespace before it starts ([`MountTable::well_known`]).
    pub bind_mounts: Vec<(PathBuf, String)>,
}

#[derive(Clone, Debug)]
pub(crate) enum Setup {
    /// initdb into an empty `pgdata`, then create `database`.
    Postgres {
        bin_dir: PathBuf,
        pgdata: PathBuf,
        user: String,
        password: String,
        database: String,
        socket_dir: PathBuf,
    },
}

/// What the launch depends on besides the container.
pub(crate) struct LaunchContext<'a> {
    pub runner: &'a Runner,
    pub container: &'a Container,
    /// Resolved env, not yet path-translated.
    pub env: Vec<(String, String)>,
    pub mounts: &'a MountTable,
    /// The container's own directory (cwd, HOME, stand-in root filesystem).
    pub container_dir: &'a Path,
    /// A short directory for the container's Unix sockets.
    pub socket_dir: &'a Path,
    pub hostname: &'a str,
    /// The pod's IP, unique on the machine while the pod runs.
    pub pod_ip: std::net::Ipv4Addr,
}

/// gRPC ports for SeaweedFS's components, unique per pod on the machine.
///
/// SeaweedFS also serves each gRPC port on a Unix socket with a fixed path,
/// `/tmp/seaweedfs-<component>-grpc-<port>.sock` (not under `TMPDIR`, and
/// no flag moves it). Pods share the host's `/tmp`, so two MinIO pods on
/// the default ports would reach each other's volume servers: one's master
/// allocates a volume on the other's, and its writes fail "volume N not
/// found". The pod IP (10.244.N.M, unique on the machine) picks the ports;
/// they are bound inside the pod's own network namespace.
fn seaweed_grpc_ports(pod_ip: std::net::Ipv4Addr) -> [(&'static str, u16); 5] {
    let [_, _, n, m] = pod_ip.octets();
    let slot = (u16::from(n) % 16) * 256 + u16::from(m);
    let port = |component: u16| 20_000 + component * 4096 + slot;
    [
        ("master.port.grpc", port(0)),
        ("volume.port.grpc", port(1)),
        ("filer.port.grpc", port(2)),
        ("s3.port.grpc", port(3)),
        ("admin.port.grpc", port(4)),
    ]
}

/// The creation script that replaces `mc mb --ignore-existing`: one signed
/// PUT of the bucket; "already owned by you" counts as success.
const CREATE_BUCKET: &str = r#"
region="${BATON_S3_REGION:-}"; [ -n "$region" ] || region=us-east-1
endpoint="${BATON_S3_ENDPOINT%/}"
code=$(curl -sS -o create-bucket.out -w '%{http_code}' --aws-sigv4 "aws:amz:${region}:s3" \
  --user "${BATON_S3_ACCESS_KEY_ID}:${BATON_S3_SECRET_ACCESS_KEY}" \
  -X PUT "${endpoint}/${BATON_S3_BUCKET}") || { echo "cannot reach ${endpoint}" >&2; exit 1; }
case "$code" in
  2??) echo "bucket ${BATON_S3_BUCKET} created"; exit 0 ;;
  409) if grep -q -e BucketAlreadyOwnedByYou -e BucketAlreadyExists create-bucket.out; then
         echo "bucket ${BATON_S3_BUCKET} already exists"; exit 0
       fi ;;
esac
cat create-bucket.out >&2; echo >&2
echo "creating bucket ${BATON_S3_BUCKET} failed: HTTP $code" >&2
exit 1
"#;

/// Kubernetes' command line: `command` replaces the image's entrypoint,
/// `args` its default arguments; `$(VAR)` is expanded in both.
fn command_line(container: &Container, env: &HashMap<&str, &str>) -> (Vec<String>, Vec<String>) {
    let expand_all = |v: &Option<Vec<String>>| -> Vec<String> {
        v.iter().flatten().map(|s| expand(s, env)).collect()
    };
    (expand_all(&container.command), expand_all(&container.args))
}

pub(crate) fn build(ctx: LaunchContext<'_>) -> Result<Launch, String> {
    let defined: HashMap<&str, &str> = ctx
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let (command, args) = command_line(ctx.container, &defined);
    let lookup = |key: &str| defined.get(key).map(|v| (*v).to_owned());
    let mounts = ctx.mounts;
    let cdir = ctx.container_dir;

    let mut path_prefix: Option<PathBuf> = None;
    let mut extra_env: Vec<(String, String)> = Vec::new();
    let mut user = None;
    let mut setup = None;
    let (program, program_args): (String, Vec<String>) = match ctx.runner {
        Runner::Baton { binary } => match command.split_first() {
            Some((first, rest)) if Path::new(first).file_name() != Some("baton".as_ref()) => {
                (first.clone(), rest.iter().chain(&args).cloned().collect())
            }
            Some((_, rest)) => (
                binary.display().to_string(),
                rest.iter().chain(&args).cloned().collect(),
            ),
            None => (binary.display().to_string(), args),
        },
        Runner::BatonAgent { binary } => {
            let port = lookup(baton_api::constants::env::AGENT_PORT)
                .unwrap_or_else(|| baton_api::constants::ports::DEFAULT_AGENT.to_string());
            (
                binary.display().to_string(),
                vec!["agent".into(), "--listen".into(), format!("0.0.0.0:{port}")],
            )
        }
        Runner::Redis => {
            let mut all: Vec<String> = command.into_iter().chain(args).collect();
            if all.first().is_some_and(|a| a.ends_with("redis-server")) {
                all.remove(0);
            }
            match all.first() {
                // The official image runs any other program it is given.
                Some(first) if !first.starts_with('-') && !first.ends_with(".conf") => {
                    let program = all.remove(0);
                    (program, all)
                }
                _ => {
                    // The image's redis-server is built with protected mode
                    // off; `--dir` outside every mount lands in the
                    // container's stand-in root.
                    let mut out = vec!["--protected-mode".to_owned(), "no".to_owned()];
                    let mut iter = all.into_iter();
                    while let Some(arg) = iter.next() {
                        if arg == "--dir"
                            && let Some(dir) = iter.next()
                        {
                            out.push(arg);
                            out.push(data_path(mounts, cdir, &dir).display().to_string());
                        } else {
                            out.push(arg);
                        }
                    }
                    ("redis-server".to_owned(), out)
                }
            }
        }
        Runner::Postgres { bin_dir } => {
            let pg_user = lookup("POSTGRES_USER").unwrap_or_else(|| "postgres".into());
            let password = lookup("POSTGRES_PASSWORD").unwrap_or_default();
            let database = lookup("POSTGRES_DB").unwrap_or_else(|| pg_user.clone());
            let pgdata = data_path(
                mounts,
                cdir,
                &lookup("PGDATA").unwrap_or_else(|| "/var/lib/postgresql/data".into()),
            );
            let socket_dir = ctx.socket_dir.to_path_buf();
            let mut all: Vec<String> = command.into_iter().chain(args).collect();
            if all.first().is_some_and(|a| a.ends_with("postgres")) {
                all.remove(0);
            }
            user = Some("postgres".to_owned());
            path_prefix = Some(bin_dir.clone());
            extra_env.push(("PGDATA".into(), pgdata.display().to_string()));
            extra_env.push(("PGHOST".into(), socket_dir.display().to_string()));
            let mut pg_args: Vec<String> = vec![
                "-D".into(),
                pgdata.display().to_string(),
                "-p".into(),
                baton_api::constants::ports::POSTGRES.to_string(),
                "-k".into(),
                socket_dir.display().to_string(),
                "-c".into(),
                "listen_addresses=*".into(),
                // Test data need not survive a machine crash.
                "-c".into(),
                "fsync=off".into(),
            ];
            pg_args.extend(all);
            setup = Some(Setup::Postgres {
                bin_dir: bin_dir.clone(),
                pgdata,
                user: pg_user,
                password,
                database,
                socket_dir,
            });
            (bin_dir.join("postgres").display().to_string(), pg_args)
        }
        Runner::SeaweedAsMinio => {
            let all: Vec<String> = command.into_iter().chain(args).collect();
            let mut data = "/data".to_owned();
            let mut port = baton_api::constants::ports::MINIO;
            let mut iter = all.iter().skip_while(|a| *a != "server").skip(1);
            while let Some(arg) = iter.next() {
                if arg == "--address" {
                    if let Some(p) = iter.next().and_then(|a| a.rsplit(':').next()?.parse().ok()) {
                        port = p;
                    }
                } else if arg.starts_with("--") {
                    // Flags with a value (--console-address :9001 …).
                    iter.next();
                } else {
                    data = arg.clone();
                }
            }
            let dir = data_path(mounts, cdir, &data);
            if let Some(v) = lookup("MINIO_ROOT_USER") {
                extra_env.push(("AWS_ACCESS_KEY_ID".into(), v));
            }
            if let Some(v) = lookup("MINIO_ROOT_PASSWORD") {
                extra_env.push(("AWS_SECRET_ACCESS_KEY".into(), v));
            }
            (
                "weed".into(),
                vec![
                    "mini".into(),
                    format!("-dir={}", dir.display()),
                    "-ip=127.0.0.1".into(),
                    "-ip.bind=0.0.0.0".into(),
                    format!("-s3.port={port}"),
                    "-admin.ui=false".into(),
                    "-webdav=false".into(),
                    "-s3.port.iceberg=0".into(),
                    "-s3.port.lance=0".into(),
                    // Unix sockets live in the filesystem, which pods share:
                    // the defaults in /tmp would collide between two pods.
                    format!(
                        "-filer.localSocket={}",
                        ctx.socket_dir.join("filer.sock").display()
                    ),
                    format!(
                        "-s3.localSocket={}",
                        ctx.socket_dir.join("s3.sock").display()
                    ),
                ]
                .into_iter()
                .chain(
                    seaweed_grpc_ports(ctx.pod_ip)
                        .into_iter()
                        .map(|(flag, port)| format!("-{flag}={port}")),
                )
                .collect(),
            )
        }
        Runner::CurlAsMinioClient => (
            "sh".into(),
            vec!["-c".into(), CREATE_BUCKET.trim_start().to_owned()],
        ),
        Runner::Host => {
            let mut all: Vec<String> = command.into_iter().chain(args).collect();
            if all.is_empty() {
                return Err("the container has neither command nor args to run".into());
            }
            let program = all.remove(0);
            (program, all)
        }
    };

    let host_path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    let path = match path_prefix {
        Some(prefix) => format!("{}:{host_path}", prefix.display()),
        None => host_path,
    };
    let tmp = mounts
        .mounted_at("/tmp")
        .map(Path::to_path_buf)
        .unwrap_or_else(|| cdir.join("tmp"));
    let mut env: Vec<(String, String)> = vec![
        ("PATH".into(), path),
        ("HOME".into(), cdir.display().to_string()),
        ("HOSTNAME".into(), ctx.hostname.to_owned()),
        ("TMPDIR".into(), tmp.display().to_string()),
    ];
    // The container's values name container paths; the node's own
    // (extra_env) are host paths already.
    let container_env = ctx.env.into_iter().map(|(k, v)| (k, mounts.translate(&v)));
    for (k, v) in container_env.chain(extra_env) {
        env.retain(|(key, _)| *key != k);
        env.push((k, v));
    }
    // A binary the node picked for the image is a host path: a container
    // mount must not capture it (the sidecar mounts /tmp, and a checkout
    // can live under /tmp).
    let node_binary = match ctx.runner {
        Runner::Baton { binary } | Runner::BatonAgent { binary } => Some(binary.clone()),
        Runner::Postgres { bin_dir } => Some(bin_dir.join("postgres")),
        _ => None,
    };
    let program = if node_binary.as_deref() == Some(Path::new(&program)) {
        program
    } else {
        mounts.translate(&program)
    };
    let cwd = ctx
        .container
        .working_dir
        .as_deref()
        .and_then(|w| mounts.host_path(w))
        .unwrap_or_else(|| cdir.to_path_buf());
    Ok(Launch {
        program,
        args: program_args.iter().map(|a| mounts.translate(a)).collect(),
        env,
        cwd,
        user,
        setup,
        bind_mounts: mounts.well_known(),
        mounts: mounts.clone(),
    })
}

/// A data directory of a store image: its host path when under a mount,
/// else a path inside the container's stand-in root directory (never the
/// host's own `/data` or `/var/lib/postgresql`).
fn data_path(mounts: &MountTable, container_dir: &Path, path: &str) -> PathBuf {
    mounts.host_path(path).unwrap_or_else(|| {
        container_dir
            .join("rootfs")
            .join(path.trim_start_matches('/'))
    })
}

/// Runs the Postgres image's first-start work: `initdb` (as `postgres`,
/// password auth from other hosts, trust on the loopback as the image
/// does) into an empty data directory, then `CREATE DATABASE` in
/// single-user mode.
pub(crate) async fn run_setup(setup: &Setup, log: &Path) -> Result<(), String> {
    let Setup::Postgres {
        bin_dir,
        pgdata,
        user,
        password,
        database,
        socket_dir,
    } = setup;
    // Neither step uses the network: no namespace needed.
    let as_postgres = |program: PathBuf| {
        let mut cmd = tokio::process::Command::new("setpriv");
        cmd.args(super::process::setpriv_args("postgres"))
            .arg(program);
        cmd
    };
    for dir in [pgdata.as_path(), socket_dir.as_path()] {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        chown_postgres(dir).await?;
    }
    use std::os::unix::fs::PermissionsExt;
    let _ = std::fs::set_permissions(pgdata, std::fs::Permissions::from_mode(0o700));
    if pgdata.join("PG_VERSION").exists() {
        return Ok(());
    }
    let pwfile = socket_dir.join(".pwfile");
    std::fs::write(&pwfile, format!("{password}\n")).map_err(|e| e.to_string())?;
    chown_postgres(&pwfile).await?;
    let mut initdb = as_postgres(bin_dir.join("initdb"));
    initdb
        .arg("-D")
        .arg(pgdata)
        .args(["-U", user, "-E", "UTF8", "--no-sync"])
        .arg(format!("--pwfile={}", pwfile.display()));
    let result = run_logged(initdb, log, "initdb").await;
    let _ = std::fs::remove_file(&pwfile);
    result?;
    let hba = pgdata.join("pg_hba.conf");
    let mut rules = std::fs::read_to_string(&hba).map_err(|e| e.to_string())?;
    rules.push_str("\nhost all all all scram-sha-256\n");
    std::fs::write(&hba, rules).map_err(|e| e.to_string())?;
    if database != "postgres" {
        let mut single = as_postgres(bin_dir.join("postgres"));
        single.args(["--single", "-D"]).arg(pgdata).arg("postgres");
        let sql = format!("CREATE DATABASE \"{}\"\n", database.replace('"', "\"\""));
        run_logged_with_input(single, log, "create database", sql).await?;
    }
    Ok(())
}

async fn chown_postgres(path: &Path) -> Result<(), String> {
    let status = tokio::process::Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(path)
        .status()
        .await
        .map_err(|e| format!("chown: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("chown postgres {} failed", path.display()))
    }
}

async fn run_logged(cmd: tokio::process::Command, log: &Path, what: &str) -> Result<(), String> {
    run_logged_with_input(cmd, log, what, String::new()).await
}

async fn run_logged_with_input(
    mut cmd: tokio::process::Command,
    log: &Path,
    what: &str,
    input: String,
) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    let (out, err) = super::process::log_stdio(log).map_err(|e| e.to_string())?;
    let mut child = cmd
        .stdin(std::process::Stdio::piped())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("{what}: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(input.as_bytes()).await;
    }
    let status = child.wait().await.map_err(|e| format!("{what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status}); see the container log"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(json: serde_json::Value) -> Container {
        serde_json::from_value(json).unwrap()
    }

    fn launch(runner: &Runner, c: &Container, env: &[(&str, &str)]) -> Launch {
        let mounts = MountTable::new([("/data".to_owned(), PathBuf::from("/h/pv"))]);
        build(LaunchContext {
            runner,
            container: c,
            env: env
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
            mounts: &mounts,
            container_dir: Path::new("/h/c"),
            socket_dir: Path::new("/run/x/c"),
            hostname: "p-0",
            pod_ip: std::net::Ipv4Addr::new(10, 244, 3, 7),
        })
        .unwrap()
    }

    #[test]
    fn redis_gets_its_args_expanded_and_translated() {
        let c = container(serde_json::json!({
            "name": "redis",
            "args": ["--dir", "/data", "--requirepass", "$(REDIS_PASSWORD)"]
        }));
        let l = launch(&Runner::Redis, &c, &[("REDIS_PASSWORD", "pw")]);
        assert_eq!(l.program, "redis-server");
        assert_eq!(
            l.args,
            [
                "--protected-mode",
                "no",
                "--dir",
                "/h/pv",
                "--requirepass",
                "pw"
            ]
        );
        assert!(l.env.contains(&("HOSTNAME".into(), "p-0".into())));
    }

    #[test]
    fn the_node_binary_is_not_taken_for_a_path_under_a_mount() {
        // A checkout under /tmp, and a sidecar that mounts /data: the
        // binary's host path stays, the container's own paths move.
        let binary = PathBuf::from("/data/ci/target/debug/baton");
        let c = container(serde_json::json!({
            "name": "sidecar", "args": ["sidecar", "--workspace-dir=/data/ws"]
        }));
        let l = launch(&Runner::Baton { binary }, &c, &[("BATON_DIR", "/data/x")]);
        assert_eq!(l.program, "/data/ci/target/debug/baton");
        assert_eq!(l.args, ["sidecar", "--workspace-dir=/h/pv/ws"]);
        assert!(l.env.contains(&("BATON_DIR".into(), "/h/pv/x".into())));
        // A program the container names is its own path.
        let c = container(serde_json::json!({"name": "tool", "command": ["/data/bin/tool"]}));
        let l = launch(&Runner::Host, &c, &[]);
        assert_eq!(l.program, "/h/pv/bin/tool");
    }

    #[test]
    fn baton_replaces_the_entrypoint_and_agents_listen_on_their_port() {
        let binary = PathBuf::from("/t/baton");
        let c = container(serde_json::json!({"name": "sidecar", "args": ["sidecar"]}));
        let l = launch(
            &Runner::Baton {
                binary: binary.clone(),
            },
            &c,
            &[],
        );
        assert_eq!(
            (l.program.as_str(), l.args.as_slice()),
            ("/t/baton", &["sidecar".to_owned()][..])
        );
        let c = container(serde_json::json!({"name": "agent", "command": ["/app/server"]}));
        let l = launch(
            &Runner::BatonAgent { binary },
            &c,
            &[
                ("BATON_AGENT_PORT", "9090"),
                ("BATON_WORKSPACE_DIR", "/data/ws"),
            ],
        );
        assert_eq!(l.args, ["agent", "--listen", "0.0.0.0:9090"]);
        assert!(
            l.env
                .contains(&("BATON_WORKSPACE_DIR".into(), "/h/pv/ws".into()))
        );
    }

    #[test]
    fn minio_becomes_weed_with_the_root_credentials_as_keys() {
        let c = container(serde_json::json!({
            "name": "minio", "args": ["server", "/data", "--address", ":9000"]
        }));
        let l = launch(
            &Runner::SeaweedAsMinio,
            &c,
            &[("MINIO_ROOT_USER", "ak"), ("MINIO_ROOT_PASSWORD", "sk")],
        );
        assert_eq!(l.program, "weed");
        assert!(l.args.contains(&"-dir=/h/pv".to_owned()));
        assert!(l.args.contains(&"-s3.port=9000".to_owned()));
        // gRPC ports (and so SeaweedFS's fixed socket paths) from the pod IP.
        assert!(l.args.contains(&format!(
            "-volume.port.grpc={}",
            20_000 + 4096 + 3 * 256 + 7
        )));
        assert!(l.env.contains(&("AWS_ACCESS_KEY_ID".into(), "ak".into())));
        assert!(
            l.env
                .contains(&("AWS_SECRET_ACCESS_KEY".into(), "sk".into()))
        );
    }

    #[test]
    fn postgres_data_outside_mounts_stays_inside_the_container_dir() {
        let c = container(serde_json::json!({"name": "pg"}));
        let l = launch(
            &Runner::Postgres {
                bin_dir: PathBuf::from("/pg/bin"),
            },
            &c,
            &[("POSTGRES_USER", "baton"), ("POSTGRES_PASSWORD", "pw")],
        );
        assert_eq!(l.user.as_deref(), Some("postgres"));
        let Some(Setup::Postgres {
            pgdata, database, ..
        }) = &l.setup
        else {
            panic!("postgres setup");
        };
        assert_eq!(pgdata, Path::new("/h/c/rootfs/var/lib/postgresql/data"));
        assert_eq!(database, "baton");
    }
}
