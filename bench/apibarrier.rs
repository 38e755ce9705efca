//! A gang barrier through the API server, the way JobSet's in-place-restart
//! agent builds one (KEP-467): every pod reports that it is ready to go by
//! patching its own annotation, and waits until the count of reported pods
//! reaches the gang's size — by a watch (`--mode watch`, what an informer
//! gives), or by listing the pods every `--period` (`--mode poll`, what a
//! startup probe polling "is the barrier lifted" every second costs).
//!
//! `bench/pods --only gang-start` runs it as an init container beside
//! zkgate's own forms and an ungated floor, on the one-node cluster. It
//! prints, on this machine's clock (the cluster is one node, so the pods'
//! clocks are one):
//!
//! ```text
//! registered-us N    its own report is stored (the patch returned)
//! released-us N      it saw the count reached
//! ```

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};

/// The annotation a pod sets when it is ready to go.
const ARRIVED: &str = "bench.zkgate.io/arrived";

fn now_us() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

fn arrived(pod: &Pod) -> bool {
    pod.annotations().contains_key(ARRIVED)
}

struct Options {
    count: usize,
    selector: String,
    poll: Option<Duration>,
}

fn options(args: &[String]) -> anyhow::Result<Options> {
    let mut count = None;
    let mut selector = None;
    let mut mode = "watch".to_string();
    let mut period = Duration::from_secs(1);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--count" => count = Some(value()?.parse().context("--count")?),
            "--selector" => selector = Some(value()?.clone()),
            "--mode" => mode = value()?.clone(),
            "--period" => period = humantime::parse_duration(value()?).context("--period")?,
            other => bail!("unknown argument {other}"),
        }
    }
    let poll = match mode.as_str() {
        "watch" => None,
        "poll" => Some(period),
        other => bail!("--mode is watch or poll, not {other}"),
    };
    Ok(Options {
        count: count.context("--count N is required")?,
        selector: selector.context("--selector LABELS is required")?,
        poll,
    })
}

async fn run(options: Options) -> anyhow::Result<()> {
    let name = std::env::var("POD_NAME").context("POD_NAME (the downward API)")?;
    let namespace = std::env::var("POD_NAMESPACE").context("POD_NAMESPACE (the downward API)")?;
    let client = Client::try_default()
        .await
        .context("the in-cluster client")?;
    let pods: Api<Pod> = Api::namespaced(client, &namespace);
    let mark =
        serde_json::json!({ "metadata": { "annotations": { ARRIVED: now_us().to_string() } } });
    pods.patch(&name, &PatchParams::default(), &Patch::Merge(&mark))
        .await
        .context("reporting this pod's arrival")?;
    println!("registered-us {}", now_us());

    match options.poll {
        Some(period) => {
            let params = ListParams::default().labels(&options.selector);
            let mut tick = tokio::time::interval(period);
            loop {
                tick.tick().await;
                let list = pods.list(&params).await.context("listing the gang")?;
                if list.items.iter().filter(|p| arrived(p)).count() >= options.count {
                    break;
                }
            }
        }
        None => {
            // What an informer keeps: every pod of the gang, by uid.
            let mut seen: BTreeMap<String, bool> = BTreeMap::new();
            let config = watcher::Config::default().labels(&options.selector);
            let mut events = watcher(pods.clone(), config).boxed();
            loop {
                let event = events
                    .try_next()
                    .await
                    .context("watching the gang")?
                    .context("the watch ended")?;
                match event {
                    watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
                        seen.insert(pod.uid().unwrap_or_default(), arrived(&pod));
                    }
                    watcher::Event::Delete(pod) => {
                        seen.remove(&pod.uid().unwrap_or_default());
                    }
                    watcher::Event::Init | watcher::Event::InitDone => {}
                }
                if seen.values().filter(|a| **a).count() >= options.count {
                    break;
                }
            }
        }
    }
    println!("released-us {}", now_us());
    Ok(())
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let options = options(&args)?;
    // kube's TLS takes the process's crypto provider; ring, as zkgate's.
    let _ = rustls::crypto::ring::default_provider().install_default();
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("the runtime")?
        .block_on(run(options))
}
