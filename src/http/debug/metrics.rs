//! `GET /metrics`: the runtime's, the store's and the process's counters in Prometheus text
//! format, names `openprogram_*` (an external contract: names, labels and help stay).

use openprogram_storage::{EventReader, ExecutionState, MetricsSnapshot, NamedHistogram};

use crate::{QueueReport, ResourceView, Result, Runtime, WAIT_BUCKETS_MS};

/// The whole `/metrics` text: the runtime's counters, the store's, its histograms and the
/// runtime's, the indexes, then the resource queue.
pub(super) async fn text(runtime: &Runtime) -> Result<String> {
    let mut out = Prometheus::default();
    runtime_metrics(&mut out, runtime);
    store_metrics(&mut out, &runtime.store().metrics());
    let mut histograms = runtime.store().histograms();
    histograms.extend(runtime.inspect().telemetry().histograms());
    out.histograms(&histograms);
    index_metrics(
        &mut out,
        runtime.store().as_ref(),
        runtime.inspect().live_executions(),
    )?;
    if let Ok(queue) = runtime.resources().await {
        queue_metrics(&mut out, &queue);
    }
    Ok(out.text)
}

/// Prometheus text: each metric with its help and type, then its samples.
#[derive(Default)]
struct Prometheus {
    text: String,
}

/// Samples labelled `{label="value"}`, each value escaped as the text format wants.
fn labelled<'a>(
    label: &str,
    samples: impl IntoIterator<Item = (&'a str, f64)>,
) -> Vec<(String, f64)> {
    let escaped = |value: &str| {
        value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n")
    };
    samples
        .into_iter()
        .map(|(value, sample)| (format!("{{{label}=\"{}\"}}", escaped(value)), sample))
        .collect()
}

impl Prometheus {
    fn metric(&mut self, name: &str, kind: &str, help: &str, samples: &[(String, f64)]) {
        self.text.push_str(&format!(
            "# HELP openprogram_{name} {help}\n# TYPE openprogram_{name} {kind}\n"
        ));
        for (labels, value) in samples {
            self.text
                .push_str(&format!("openprogram_{name}{labels} {value}\n"));
        }
    }

    /// Histograms, each name's help and type once, then every labelled series of it (a
    /// name's series come together in `histograms`: a family's lines must be one run).
    fn histograms(&mut self, histograms: &[NamedHistogram]) {
        let mut shown = std::collections::BTreeSet::new();
        for histogram in histograms {
            let name = histogram.name;
            if shown.insert(name) {
                self.text.push_str(&format!(
                    "# HELP openprogram_{name} {}\n# TYPE openprogram_{name} histogram\n",
                    histogram.help
                ));
            }
            let labels = &histogram.labels;
            let with = |extra: String| match (labels.is_empty(), extra.is_empty()) {
                (true, true) => String::new(),
                (true, false) => format!("{{{extra}}}"),
                (false, true) => format!("{{{labels}}}"),
                (false, false) => format!("{{{labels},{extra}}}"),
            };
            let snapshot = &histogram.snapshot;
            for (bound, count) in snapshot.bounds.iter().zip(&snapshot.cumulative) {
                self.text.push_str(&format!(
                    "openprogram_{name}_bucket{} {count}\n",
                    with(format!("le=\"{bound}\""))
                ));
            }
            self.text.push_str(&format!(
                "openprogram_{name}_bucket{} {}\nopenprogram_{name}_sum{} {}\nopenprogram_{name}_count{} {}\n",
                with("le=\"+Inf\"".into()),
                snapshot.count,
                with(String::new()),
                snapshot.sum,
                with(String::new()),
                snapshot.count
            ));
        }
    }

    fn counter(&mut self, name: &str, help: &str, value: f64) {
        self.metric(name, "counter", help, &[(String::new(), value)]);
    }

    fn gauge(&mut self, name: &str, help: &str, value: f64) {
        self.metric(name, "gauge", help, &[(String::new(), value)]);
    }
}

/// The runtime's own: steps, model tokens, rejections, state loads, retention, the
/// process's CPU and memory, live actors.
fn runtime_metrics(out: &mut Prometheus, runtime: &Runtime) {
    let inspect = runtime.inspect();
    out.counter(
        "steps_total",
        "Steps committed: model decisions and tool results, each with its checkpoint.",
        inspect.steps() as f64,
    );
    let (input_tokens, output_tokens) = inspect.model_tokens();
    out.metric(
        "model_tokens_total",
        "counter",
        "Tokens the model calls of this node's executions used, as their providers reported \
         them.",
        &labelled(
            "kind",
            [
                ("input", input_tokens as f64),
                ("output", output_tokens as f64),
            ],
        ),
    );
    let telemetry = inspect.telemetry();
    let rejections = telemetry.rejections();
    out.metric(
        "commands_rejected_total",
        "counter",
        "Commands rejected, by their stable code: nothing of the execution changed.",
        &labelled(
            "code",
            rejections
                .iter()
                .map(|(code, count)| (code.as_ref(), *count as f64)),
        ),
    );
    out.counter(
        "reconciliations_total",
        "Unknown effects resolved: by an operator's reconcile or a tool's protocol.",
        telemetry.reconciliations() as f64,
    );
    let (parked, replayed) = inspect.state_loads();
    out.metric(
        "state_loads_total",
        "counter",
        "Execution states loaded for an activation or a read: from a parked state kept in \
         memory, by replaying the execution's events, or from its projection and the events \
         after it.",
        &labelled(
            "from",
            [
                ("parked", parked as f64),
                ("replay", replayed as f64),
                ("projection", inspect.projected_loads() as f64),
            ],
        ),
    );
    retention_metrics(out, runtime);
    out.counter(
        "process_cpu_seconds_total",
        "CPU time of the server process, all threads, user and system.",
        crate::process_stats::process_cpu().map_or(0.0, |cpu| cpu.as_secs_f64()),
    );
    out.gauge(
        "process_peak_resident_bytes",
        "The server process's peak resident memory (VmHWM).",
        crate::process_stats::peak_rss_mib() * 1024.0 * 1024.0,
    );
    out.metric(
        "live_actors",
        "gauge",
        "Live actors by kind.",
        &labelled(
            "kind",
            [
                ("execution", inspect.live_executions() as f64),
                ("process", inspect.live_processes() as f64),
                (
                    "supervisor",
                    f64::from(u8::from(runtime.supervisor_running())),
                ),
            ],
        ),
    );
    out.gauge(
        "execution_mailbox_messages",
        "Messages waiting in the mailboxes of this node's execution actors: commands, answers \
         and wakes sent and not yet handled. /debug/actors shows each actor's.",
        inspect.execution_mailbox_messages() as f64,
    );
}

/// S-8: what retention purged and swept, and the store's size on disk.
fn retention_metrics(out: &mut Prometheus, runtime: &Runtime) {
    let retention = runtime.retention_stats();
    let relaxed = std::sync::atomic::Ordering::Relaxed;
    out.counter(
        "executions_purged_total",
        "Executions purged by retention since the runtime opened.",
        retention.executions_purged.load(relaxed) as f64,
    );
    out.counter(
        "log_records_swept_total",
        "Log records removed by the log's sweep (every frame of a purged execution).",
        retention.log_records_deleted.load(relaxed) as f64,
    );
    out.gauge(
        "store_bytes",
        "The bytes the store's files take on disk.",
        runtime.store().disk_bytes() as f64,
    );
    out.counter(
        "store_sled_copies_total",
        "Times the embedded store copied its key files into a new generation to give back the space they had grown into.",
        runtime.store().metrics().sled_generations as f64,
    );
}

/// The write path's counters (`MetricsSnapshot`).
fn store_metrics(out: &mut Prometheus, counters: &MetricsSnapshot) {
    let seconds = |micros: u64| micros as f64 / 1e6;
    out.counter(
        "commits_total",
        "Transitions committed (acknowledged after fsync).",
        counters.transitions as f64,
    );
    out.gauge(
        "committer_queue_depth",
        "Transitions waiting for the committer: its mailbox depth.",
        counters.queued as f64,
    );
    out.counter(
        "group_commits_total",
        "Group commits written.",
        counters.groups as f64,
    );
    out.counter(
        "fsyncs_total",
        "fsyncs that made group commits durable (the embedded store: its journal's).",
        counters.fsyncs as f64,
    );
    out.counter(
        "fenced_writes_total",
        "Writes refused because a newer attempt holds the execution (a stale owner).",
        counters.fenced as f64,
    );
    out.counter(
        "fsync_seconds_total",
        "Time spent in fsync.",
        seconds(counters.fsync_micros_total),
    );
    out.counter(
        "flush_seconds_total",
        "Time spent in sled's flush(), which writes its buffers and waits for them, before each fsync.",
        seconds(counters.flush_micros_total),
    );
    out.counter(
        "committer_busy_seconds_total",
        "Time the committer spent on group commits (validate, write, flush, fsync, answer); its rate near 1 means the store limits throughput.",
        seconds(counters.group_micros_total),
    );
    out.counter(
        "materializations_total",
        "Materialization slices written.",
        counters.materializations as f64,
    );
    out.gauge(
        "replayed_frames",
        "Log frames replayed when the store was opened.",
        counters.replayed_frames as f64,
    );
}

/// What the store's indexes hold: executions by non-terminal state, quarantined ones.
fn index_metrics(out: &mut Prometheus, store: &dyn EventReader, live: usize) -> Result<()> {
    let mut by_state = Vec::new();
    let mut unfinished = 0;
    for state in ExecutionState::ALL
        .into_iter()
        .filter(|state| !state.is_terminal())
    {
        let count = store.count_in_state(state)?;
        by_state.push((state.as_str(), count as f64));
        unfinished += count;
    }
    out.metric(
        "executions",
        "gauge",
        "Executions by non-terminal state (ended executions are not indexed).",
        &labelled("state", by_state),
    );
    out.gauge(
        "parked_executions",
        "Executions not ended and without a live actor on this node (waiting, paused, queued, \
         idle; on a cluster, those other nodes run too): \
         they cost no memory until a command, an answer or a lease activates them.",
        unfinished.saturating_sub(live) as f64,
    );
    out.gauge(
        "quarantined_executions",
        "Executions refused for corrupted records.",
        store.quarantined().len() as f64,
    );
    Ok(())
}

/// J-1: each resource's capacity, units in use and Jobs waiting; the Jobs the queue
/// admitted, refused and expired; and how long they waited for a lease.
fn queue_metrics(out: &mut Prometheus, report: &QueueReport) {
    let by_resource = |value: fn(&ResourceView) -> f64| {
        let resources = report.resources.iter();
        labelled("resource", resources.map(|r| (r.name.as_str(), value(r))))
    };
    out.metric(
        "resource_capacity",
        "gauge",
        "Units of the resource declared.",
        &by_resource(|r| f64::from(r.capacity)),
    );
    out.metric(
        "resource_in_use",
        "gauge",
        "Units of the resource leased to Jobs (held, or offered and not yet answered).",
        &by_resource(|r| f64::from(r.in_use)),
    );
    out.metric(
        "resource_queued",
        "gauge",
        "Jobs waiting for the resource (the queue's depth).",
        &by_resource(|r| r.queued as f64),
    );
    let stats = &report.stats;
    out.counter(
        "job_admissions_total",
        "Leases committed by their Jobs.",
        stats.admissions as f64,
    );
    out.counter(
        "job_offers_refused_total",
        "Lease offers a Job did not take (it left the queue meanwhile, or was unreachable).",
        stats.refused as f64,
    );
    out.counter(
        "jobs_expired_total",
        "Jobs ended `expired` by their queue deadline.",
        stats.expired as f64,
    );
    let name = "job_queue_wait_seconds";
    out.text.push_str(&format!(
        "# HELP openprogram_{name} Time a Job waited in the queue before a lease, per admission.\n# TYPE openprogram_{name} histogram\n"
    ));
    let mut cumulative = 0;
    for (bound, count) in WAIT_BUCKETS_MS.iter().zip(&stats.wait_buckets) {
        cumulative += count;
        let le = *bound as f64 / 1000.0;
        out.text.push_str(&format!(
            "openprogram_{name}_bucket{{le=\"{le}\"}} {cumulative}\n"
        ));
    }
    out.text.push_str(&format!(
        "openprogram_{name}_bucket{{le=\"+Inf\"}} {}\nopenprogram_{name}_sum {}\nopenprogram_{name}_count {}\n",
        stats.admissions,
        stats.wait_sum.as_secs_f64(),
        stats.admissions
    ));
}
