//! `sluice admin serve`: a read-only HTML status page of the cluster.
//!
//! A poller asks the meta leader for `sluice.admin.Admin/Status` (the same
//! answer as `sluice admin status`) every `--interval`, with the admin
//! certificate, and keeps the latest answer and a bounded history of
//! samples. An HTTP/1 listener serves:
//!
//! * `GET /` — the page: meta voters and the leader, datanodes (state,
//!   capacity, credit in use against the write budget, RSS against the
//!   memory budgets), gateways (RSS, requests, `503 SlowDown` rate),
//!   degraded blobs and heals in progress, and inline SVG charts of RSS,
//!   SlowDown rate and degraded blobs over the history. Plain
//!   server-rendered HTML that reloads itself every `--interval`
//!   (`<meta http-equiv="refresh">`); no script.
//! * `GET /status.json` — the latest answer as `sluice admin status --json`
//!   prints it, plus `polled_ms` and `error`.
//! * `GET /health/live` — 200 while the page is served.
//!
//! Read-only: the page changes nothing in the cluster, and it serves no
//! secret (no keys, no certificates). It does show the cluster's layout,
//! so it binds to loopback unless `--listen` says otherwise.
//!
//! Bounds: the history holds at most `--history` samples (default 360: 30
//! minutes at 5 s), each with one entry per process that reported memory,
//! at most [`MAX_PROCESSES_PER_SAMPLE`]; at most [`MAX_PAGE_CONNECTIONS`]
//! connections are served at once, each closed after [`PAGE_TIMEOUT`].

use sluice_util::clock::wall_clock_ms;
use std::collections::{BTreeMap, VecDeque};
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use clap::Args;
use hyper::{Method, StatusCode};
use quick_xml::escape::escape;
use sluice_meta_client::MetaClient;
use sluice_proto::admin::{ProcessMemory, StatusResponse};

use super::AdminConn;
use super::status::{StatusJson, ago, fetch, non_empty, size, voter_cells, worker_rows};

/// Most connections served at once; more wait in the TCP backlog.
pub const MAX_PAGE_CONNECTIONS: usize = 32;
/// A page connection is closed after this long, answered or not.
pub const PAGE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most processes recorded per history sample (the chart's lines).
pub const MAX_PROCESSES_PER_SAMPLE: usize = 64;
/// Largest `--history`.
pub const MAX_HISTORY: usize = 100_000;

/// `sluice admin serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    pub conn: AdminConn,
    /// Address the page is served on (plain HTTP).
    #[arg(long, default_value = "127.0.0.1:9300")]
    pub listen: SocketAddr,
    /// How often the cluster status is polled and the page reloads.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// Samples kept for the charts (at most 100000).
    #[arg(long, default_value_t = 360)]
    pub history: usize,
}

/// One poll's figures, for the charts.
#[derive(Debug, Clone, PartialEq)]
struct Sample {
    /// Leader wall clock of the answer, ms since the Unix epoch.
    at_ms: i64,
    /// Process name -> (RSS, sum of its memory budgets), bytes.
    memory: BTreeMap<String, (u64, u64)>,
    /// Gateway id -> (requests, SlowDowns) since that gateway started.
    gateways: BTreeMap<String, (u64, u64)>,
    degraded_blobs: u64,
    heals_in_progress: u64,
}

impl Sample {
    fn of(s: &StatusResponse) -> Sample {
        let mut memory = BTreeMap::new();
        let mut add = |name: String, m: Option<&ProcessMemory>| {
            if let Some(m) = m.filter(|m| m.reported_ms != 0)
                && memory.len() < MAX_PROCESSES_PER_SAMPLE
            {
                memory.insert(name, (m.rss_bytes, m.budget_bytes));
            }
        };
        add(format!("meta-{}", s.leader_id), s.leader_memory.as_ref());
        for d in &s.datanodes {
            add(format!("datanode-{}", d.id), d.memory.as_ref());
        }
        for g in &s.gateways {
            add(g.gateway_id.clone(), g.memory.as_ref());
        }
        Sample {
            at_ms: s.now_ms,
            memory,
            gateways: s
                .gateways
                .iter()
                .take(MAX_PROCESSES_PER_SAMPLE)
                .map(|g| (g.gateway_id.clone(), (g.requests_total, g.slowdowns_total)))
                .collect(),
            degraded_blobs: s.degraded_blobs,
            heals_in_progress: s.heals_in_progress,
        }
    }
}

/// SlowDown answers per second and their share of requests between two
/// samples, over the gateways present in both (a restarted gateway has a
/// new id and starts from zero), or over `gateway` only: `None` when it is
/// not in both.
fn slowdown_rate(before: &Sample, after: &Sample, gateway: Option<&str>) -> Option<(f64, f64)> {
    let secs = (after.at_ms - before.at_ms) as f64 / 1000.0;
    if secs <= 0.0 {
        return None;
    }
    let (mut requests, mut slowdowns, mut seen) = (0u64, 0u64, false);
    let chosen = after
        .gateways
        .iter()
        .filter(|(id, _)| gateway.is_none_or(|g| g == id.as_str()));
    for (id, (r1, s1)) in chosen {
        if let Some((r0, s0)) = before.gateways.get(id) {
            seen = true;
            requests += r1.saturating_sub(*r0);
            slowdowns += s1.saturating_sub(*s0);
        }
    }
    if gateway.is_some() && !seen {
        return None;
    }
    let share = if requests == 0 {
        0.0
    } else {
        slowdowns as f64 / requests as f64
    };
    Some((slowdowns as f64 / secs, share))
}

/// What the page shows: the latest answer and the history.
#[derive(Debug, Default)]
struct PageState {
    latest: Option<StatusResponse>,
    /// Local wall clock of the last successful poll, ms.
    polled_ms: i64,
    /// The last poll's error, if it failed.
    error: Option<String>,
    history: VecDeque<Sample>,
}

/// The poller's and the server's shared state.
struct Page {
    state: Mutex<PageState>,
    interval: Duration,
    history: usize,
}

impl Page {
    fn new(interval: Duration, history: usize) -> Page {
        Page {
            state: Mutex::new(PageState::default()),
            interval,
            history,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PageState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, result: anyhow::Result<StatusResponse>) {
        let mut s = self.lock();
        match result {
            Ok(status) => {
                let sample = Sample::of(&status);
                if s.history.len() >= self.history {
                    s.history.pop_front();
                }
                s.history.push_back(sample);
                s.latest = Some(status);
                s.polled_ms = wall_clock_ms();
                s.error = None;
            }
            Err(e) => s.error = Some(format!("{e:#}")),
        }
    }
}

/// Runs `sluice admin serve` until Ctrl-C.
pub async fn run(args: ServeArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        (1..=MAX_HISTORY).contains(&args.history),
        "--history must be 1..={MAX_HISTORY}"
    );
    anyhow::ensure!(
        args.interval >= Duration::from_secs(1),
        "--interval must be at least 1s"
    );
    // One poll retries for at most one interval; each call at most 5 s.
    let meta = super::connect_with(
        &args.conn,
        args.interval,
        Duration::from_secs(5).min(args.interval),
    )?;
    let page = Arc::new(Page::new(args.interval, args.history));
    let listener = tokio::net::TcpListener::bind(args.listen).await?;
    let local = listener.local_addr()?;
    println!(
        "serving the status page on http://{local}/ (every {:?})",
        args.interval
    );
    let poller = tokio::spawn(poll(meta, Arc::clone(&page)));
    let handler_page = Arc::clone(&page);
    let handler: crate::http::Handler = Arc::new(move |method: Method, path: String| {
        let page = Arc::clone(&handler_page);
        Box::pin(async move { answer(&page, &method, &path) })
    });
    let server = tokio::spawn(crate::http::serve(
        listener,
        MAX_PAGE_CONNECTIONS,
        PAGE_TIMEOUT,
        handler,
        "status page",
    ));
    let _ = tokio::signal::ctrl_c().await;
    poller.abort();
    server.abort();
    Ok(())
}

/// Polls the leader's Status every interval, forever.
async fn poll(meta: MetaClient, page: Arc<Page>) {
    let mut ticks = tokio::time::interval(page.interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        page.record(fetch(&meta).await);
    }
}

type Response = hyper::Response<http_body_util::Full<bytes::Bytes>>;

fn answer(page: &Page, method: &Method, path: &str) -> Response {
    use crate::http::{respond, text};
    if method != Method::GET && method != Method::HEAD {
        return text(StatusCode::METHOD_NOT_ALLOWED, "read-only: GET only\n");
    }
    let state = page.lock();
    match path {
        "/" => respond(
            StatusCode::OK,
            "text/html; charset=utf-8",
            render_page(&state, page.interval),
        ),
        "/status.json" => {
            let body = serde_json::json!({
                "polled_ms": state.polled_ms,
                "error": state.error,
                "status": state.latest.as_ref().map(StatusJson::from),
            });
            respond(StatusCode::OK, "application/json", body.to_string())
        }
        "/health/live" => text(StatusCode::OK, "live: status page up\n"),
        _ => text(
            StatusCode::NOT_FOUND,
            "not found: the page is at /, its data at /status.json\n",
        ),
    }
}

/// HTML-escaped text (`&`, `<`, `>`, `'`, `"`).
fn esc(s: &str) -> String {
    escape(s).into_owned()
}

const STYLE: &str = "body{font:14px system-ui,sans-serif;margin:1.5em;color:#1d2433;background:#fafbfc}\
h1{font-size:20px;margin:0 0 .2em}h2{font-size:16px;margin:1.4em 0 .4em}\
table{border-collapse:collapse;background:#fff}td,th{padding:3px 10px;border-bottom:1px solid #e3e6ea;text-align:left;white-space:nowrap}\
th{background:#eef1f4;font-weight:600}.tiles{display:flex;flex-wrap:wrap;gap:10px;margin:.8em 0}\
.tile{background:#fff;border:1px solid #e3e6ea;border-radius:6px;padding:8px 14px;min-width:130px}\
.tile b{display:block;font-size:20px}.ok{color:#137333}.bad{color:#b3261e}.warn{color:#a05a00}\
.bar{display:inline-block;width:90px;height:9px;background:#e3e6ea;border-radius:3px;margin-right:6px;vertical-align:middle}\
.bar i{display:block;height:9px;border-radius:3px;background:#3b73c4}.bar i.hot{background:#b3261e}\
.err{background:#fdecea;border:1px solid #b3261e;padding:6px 10px;border-radius:4px}.muted{color:#6b7380}\
.charts{display:flex;flex-wrap:wrap;gap:14px}svg{background:#fff;border:1px solid #e3e6ea;border-radius:6px}";

/// A bar of `used` against `of`, red above 90 %.
fn bar(used: u64, of: u64) -> String {
    if of == 0 {
        return String::new();
    }
    let pct = (used as f64 / of as f64 * 100.0).clamp(0.0, 100.0);
    let class = if pct > 90.0 { " class=\"hot\"" } else { "" };
    format!("<span class=\"bar\"><i{class} style=\"width:{pct:.0}%\"></i></span>")
}

/// `rss / budgets` with a bar, or `-` when not reported.
fn memory_cell(m: Option<&ProcessMemory>) -> String {
    match m.filter(|m| m.reported_ms != 0) {
        Some(m) => format!(
            "{}{} / {}",
            bar(m.rss_bytes, m.budget_bytes),
            size(m.rss_bytes),
            size(m.budget_bytes)
        ),
        None => "-".to_string(),
    }
}

fn state_class(state: &str) -> &'static str {
    match state {
        "up" => "ok",
        "down" => "bad",
        _ => "warn",
    }
}

/// The whole page.
fn render_page(state: &PageState, interval: Duration) -> String {
    let mut out = String::with_capacity(32 * 1024);
    let _ = write!(
        out,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"refresh\" content=\"{}\"><title>Sluice cluster status</title>\
         <style>{STYLE}</style></head><body><h1>Sluice cluster status</h1>",
        interval.as_secs().max(1)
    );
    let Some(s) = &state.latest else {
        let _ = write!(
            out,
            "<p class=\"err\">No answer from the meta cluster yet{}</p></body></html>",
            state
                .error
                .as_deref()
                .map(|e| format!(": {}", esc(e)))
                .unwrap_or_default()
        );
        return out;
    };
    let _ = write!(
        out,
        "<p class=\"muted\">As of the leader's clock {} (polled every {}s; this page reloads itself).</p>",
        esc(&format_ms(s.now_ms)),
        interval.as_secs().max(1)
    );
    if let Some(e) = &state.error {
        let _ = write!(
            out,
            "<p class=\"err\">The last poll failed ({}); showing the answer of {}.</p>",
            esc(e),
            esc(&ago(wall_clock_ms(), state.polled_ms))
        );
    }
    tiles(&mut out, s, &state.history);
    voters(&mut out, s);
    datanodes(&mut out, s);
    gateways(&mut out, s, &state.history);
    workers(&mut out, s);
    charts(&mut out, &state.history, interval);
    out.push_str("</body></html>\n");
    out
}

fn format_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (h, m, sec) = (secs / 3600 % 24, secs / 60 % 60, secs % 60);
    format!("{h:02}:{m:02}:{sec:02} UTC")
}

fn tiles(out: &mut String, s: &StatusResponse, history: &VecDeque<Sample>) {
    let up = s.datanodes.iter().filter(|d| d.state == "up").count();
    let (used, free) = s.datanodes.iter().fold((0u64, 0u64), |(u, f), d| {
        (u + d.used_bytes, f + if d.live { d.free_bytes } else { 0 })
    });
    let reachable = s.voters.iter().filter(|v| v.reachable).count();
    let rate = latest_rate(history, None);
    let tile = |out: &mut String, label: &str, value: String, class: &str| {
        let _ = write!(
            out,
            "<div class=\"tile\">{}<b class=\"{class}\">{value}</b></div>",
            esc(label)
        );
    };
    out.push_str("<div class=\"tiles\">");
    tile(
        out,
        "meta leader",
        format!("node {} · term {}", s.leader_id, s.term),
        "ok",
    );
    tile(
        out,
        "meta voters reachable",
        format!("{reachable} / {}", s.voters.len()),
        if reachable == s.voters.len() {
            "ok"
        } else {
            "warn"
        },
    );
    tile(
        out,
        "datanodes up",
        format!("{up} / {}", s.datanodes.len()),
        if up == s.datanodes.len() { "ok" } else { "bad" },
    );
    tile(
        out,
        "capacity used / free",
        format!("{} / {}", size(used), size(free)),
        "",
    );
    tile(
        out,
        "degraded blobs",
        format!(
            "{}{}",
            if s.degraded_capped { "≥ " } else { "" },
            s.degraded_blobs
        ),
        if s.degraded_blobs == 0 { "ok" } else { "warn" },
    );
    tile(
        out,
        "heals in progress",
        s.heals_in_progress.to_string(),
        "",
    );
    tile(
        out,
        "SlowDown rate",
        match rate {
            Some((per_sec, share)) => format!("{per_sec:.1}/s · {:.1} %", share * 100.0),
            None => "-".to_string(),
        },
        if rate.is_some_and(|(r, _)| r > 0.0) {
            "warn"
        } else {
            "ok"
        },
    );
    out.push_str("</div>");
}

/// SlowDown rate between the last two samples, over every gateway or over
/// `gateway` only.
fn latest_rate(history: &VecDeque<Sample>, gateway: Option<&str>) -> Option<(f64, f64)> {
    let n = history.len();
    (n >= 2)
        .then(|| slowdown_rate(&history[n - 2], &history[n - 1], gateway))
        .flatten()
}

fn voters(out: &mut String, s: &StatusResponse) {
    out.push_str(
        "<h2>Meta voters</h2><table><tr><th>id</th><th>address</th><th>role</th>\
         <th>term</th><th>applied index</th><th>matched index</th></tr>",
    );
    for v in &s.voters {
        let [role, term, applied, matched] = voter_cells(v);
        let class = if v.reachable { "ok" } else { "bad" };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td class=\"{class}\">{role}</td><td>{term}</td><td>{applied}</td><td>{matched}</td></tr>",
            v.id,
            esc(&v.addr),
        );
    }
    let _ = write!(
        out,
        "</table><p class=\"muted\">Commit index {}, leader applied index {}, leader memory {}.</p>",
        s.commit_index,
        s.applied_index,
        memory_cell(s.leader_memory.as_ref())
    );
}

fn datanodes(out: &mut String, s: &StatusResponse) {
    out.push_str(
        "<h2>Datanodes</h2><table><tr><th>id</th><th>zone</th><th>host</th><th>state</th>\
         <th>used</th><th>free</th><th>credit in use / write budget</th>\
         <th>RSS / memory budgets</th><th>last heartbeat</th><th>address</th></tr>",
    );
    for d in &s.datanodes {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td class=\"{}\">{}</td><td>{}</td><td>{}</td>\
             <td>{}{} / {}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            d.id,
            esc(&non_empty(&d.zone).unwrap_or_else(|| "-".into())),
            esc(&non_empty(&d.host).unwrap_or_else(|| "-".into())),
            state_class(&d.state),
            esc(&d.state),
            size(d.used_bytes),
            size(d.free_bytes),
            bar(d.credit_in_use_bytes, d.write_budget_bytes),
            size(d.credit_in_use_bytes),
            size(d.write_budget_bytes),
            memory_cell(d.memory.as_ref()),
            if d.last_heartbeat_ms == 0 {
                "-".to_string()
            } else {
                ago(s.now_ms, d.last_heartbeat_ms)
            },
            esc(&d.addr),
        );
    }
    out.push_str("</table>");
}

fn gateways(out: &mut String, s: &StatusResponse, history: &VecDeque<Sample>) {
    out.push_str("<h2>Gateways</h2>");
    if s.gateways.is_empty() {
        out.push_str("<p class=\"muted\">No gateway holds an open write epoch.</p>");
        return;
    }
    out.push_str(
        "<table><tr><th>gateway</th><th>open epochs</th><th>last renewal</th>\
         <th>RSS / memory budgets</th><th>requests</th><th>SlowDowns</th><th>SlowDown/s</th></tr>",
    );
    for g in &s.gateways {
        let rate = latest_rate(history, Some(&g.gateway_id)).map(|(per_sec, _)| per_sec);
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&g.gateway_id),
            g.open_epochs
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", "),
            ago(s.now_ms, g.last_renewed_ms),
            memory_cell(g.memory.as_ref()),
            g.requests_total,
            g.slowdowns_total,
            rate.map_or("-".into(), |r| format!("{r:.1}")),
        );
    }
    out.push_str("</table>");
}

/// Every node's background workers (the rows of `sluice admin status`).
fn workers(out: &mut String, s: &StatusResponse) {
    let rows = worker_rows(s);
    if rows.is_empty() {
        return;
    }
    out.push_str(
        "<h2>Workers</h2><table><tr><th>node</th><th>worker</th><th>state</th>\
         <th>passes</th><th>last error</th></tr>",
    );
    for row in rows {
        out.push_str("<tr>");
        for cell in row {
            let _ = write!(out, "<td>{}</td>", esc(&cell));
        }
        out.push_str("</tr>");
    }
    out.push_str("</table>");
}

/// Line colours of the charts.
const PALETTE: [&str; 8] = [
    "#3b73c4", "#d9822b", "#2e9e5b", "#b3261e", "#7b4fc9", "#1b9aaa", "#a05a00", "#6b7380",
];

/// One line of a chart: a label and (ms, value) points.
struct Series {
    label: String,
    points: Vec<(i64, f64)>,
}

fn charts(out: &mut String, history: &VecDeque<Sample>, interval: Duration) {
    out.push_str("<h2>History</h2>");
    if history.len() < 2 {
        let _ = write!(
            out,
            "<p class=\"muted\">Charts appear after two polls ({}s).</p>",
            interval.as_secs().max(1)
        );
        return;
    }
    let mut names: Vec<&String> = history.iter().flat_map(|s| s.memory.keys()).collect();
    names.sort();
    names.dedup();
    let rss: Vec<Series> = names
        .iter()
        .map(|name| Series {
            label: (*name).clone(),
            points: history
                .iter()
                .filter_map(|s| {
                    s.memory
                        .get(*name)
                        .map(|(rss, _)| (s.at_ms, *rss as f64 / (1 << 20) as f64))
                })
                .collect(),
        })
        .collect();
    let pairs = || history.iter().zip(history.iter().skip(1));
    let slowdowns = vec![Series {
        label: "SlowDown/s".into(),
        points: pairs()
            .filter_map(|(a, b)| slowdown_rate(a, b, None).map(|(r, _)| (b.at_ms, r)))
            .collect(),
    }];
    let healing = vec![
        Series {
            label: "degraded blobs".into(),
            points: history
                .iter()
                .map(|s| (s.at_ms, s.degraded_blobs as f64))
                .collect(),
        },
        Series {
            label: "heals in progress".into(),
            points: history
                .iter()
                .map(|s| (s.at_ms, s.heals_in_progress as f64))
                .collect(),
        },
    ];
    out.push_str("<div class=\"charts\">");
    out.push_str(&svg_chart("RSS per process (MiB)", &rss));
    out.push_str(&svg_chart("503 SlowDown answers per second", &slowdowns));
    out.push_str(&svg_chart("Degraded blobs and heals", &healing));
    out.push_str("</div>");
}

/// An inline SVG line chart of `series` over their common time range, y
/// from 0 to the largest value.
fn svg_chart(title: &str, series: &[Series]) -> String {
    const W: f64 = 460.0;
    const H: f64 = 200.0;
    const LEFT: f64 = 48.0;
    const TOP: f64 = 26.0;
    const PLOT_H: f64 = 120.0;
    let plot_w = W - LEFT - 12.0;
    let points = series.iter().flat_map(|s| s.points.iter());
    let (mut t0, mut t1, mut max) = (i64::MAX, i64::MIN, 0.0f64);
    for (t, v) in points {
        t0 = t0.min(*t);
        t1 = t1.max(*t);
        max = max.max(*v);
    }
    let max = if max > 0.0 { max * 1.1 } else { 1.0 };
    let span = (t1 - t0).max(1) as f64;
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" role=\"img\" aria-label=\"{t}\">\
         <text x=\"10\" y=\"17\" font-size=\"13\" font-weight=\"600\">{t}</text>\
         <line x1=\"{LEFT}\" y1=\"{bottom}\" x2=\"{right}\" y2=\"{bottom}\" stroke=\"#c4c9d0\"/>\
         <line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{bottom}\" stroke=\"#c4c9d0\"/>\
         <text x=\"{lx}\" y=\"{ty}\" font-size=\"10\" text-anchor=\"end\">{maxl}</text>\
         <text x=\"{lx}\" y=\"{bottom}\" font-size=\"10\" text-anchor=\"end\">0</text>\
         <text x=\"{LEFT}\" y=\"{tl}\" font-size=\"10\">-{ago}</text>\
         <text x=\"{right}\" y=\"{tl}\" font-size=\"10\" text-anchor=\"end\">now</text>",
        t = esc(title),
        bottom = TOP + PLOT_H,
        right = LEFT + plot_w,
        lx = LEFT - 4.0,
        ty = TOP + 4.0,
        maxl = short(max),
        tl = TOP + PLOT_H + 13.0,
        ago = span_text((t1 - t0).max(0)),
    );
    for (i, s) in series.iter().enumerate() {
        let colour = PALETTE[i % PALETTE.len()];
        let coords: Vec<String> = s
            .points
            .iter()
            .map(|(t, v)| {
                let x = LEFT + (t - t0) as f64 / span * plot_w;
                let y = TOP + PLOT_H - v / max * PLOT_H;
                format!("{x:.1},{y:.1}")
            })
            .collect();
        let _ = write!(
            svg,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.6\" points=\"{}\"/>",
            coords.join(" ")
        );
        // Legend: four entries per row below the plot.
        let (col, row) = ((i % 4) as f64, (i / 4) as f64);
        if row < 2.0 {
            let (x, y) = (10.0 + col * 112.0, TOP + PLOT_H + 28.0 + row * 14.0);
            let _ = write!(
                svg,
                "<rect x=\"{x}\" y=\"{}\" width=\"9\" height=\"9\" fill=\"{colour}\"/>\
                 <text x=\"{}\" y=\"{}\" font-size=\"10\">{}</text>",
                y - 8.0,
                x + 12.0,
                y,
                esc(&legend(&s.label))
            );
        }
    }
    svg.push_str("</svg>");
    svg
}

/// A legend label cut to fit its 112-pixel column.
fn legend(label: &str) -> String {
    const MAX_CHARS: usize = 17;
    if label.chars().count() <= MAX_CHARS {
        label.to_string()
    } else {
        let head: String = label.chars().take(MAX_CHARS - 1).collect();
        format!("{head}…")
    }
}

/// `1.2k`-style axis label.
fn short(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

fn span_text(ms: i64) -> String {
    let secs = ms / 1000;
    if secs < 120 {
        format!("{secs}s")
    } else {
        format!("{}m", secs / 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::status::tests::sample;

    fn sample_at(ms: i64, requests: u64, slowdowns: u64) -> Sample {
        let mut s = sample();
        s.now_ms = ms;
        s.gateways[0].requests_total = requests;
        s.gateways[0].slowdowns_total = slowdowns;
        Sample::of(&s)
    }

    #[test]
    fn slowdown_rate_follows_each_gateway() {
        let a = sample_at(1_000_000, 100, 10);
        let b = sample_at(1_005_000, 300, 60);
        let (per_sec, share) = slowdown_rate(&a, &b, None).unwrap();
        assert_eq!(per_sec, 10.0);
        assert_eq!(share, 0.25);
        // A restarted gateway (counters back to 0) counts as no SlowDowns,
        // not as a negative rate.
        let c = sample_at(1_010_000, 5, 0);
        assert_eq!(slowdown_rate(&b, &c, None).unwrap(), (0.0, 0.0));
        assert_eq!(slowdown_rate(&b, &b, None), None);
        // One gateway: its own rate, or none when a sample lacks it.
        assert_eq!(slowdown_rate(&a, &b, Some("gw-1")), Some((10.0, 0.25)));
        assert_eq!(slowdown_rate(&a, &b, Some("gw-2")), None);
    }

    #[test]
    fn legend_labels_are_cut() {
        assert_eq!(legend("datanode-1"), "datanode-1");
        assert_eq!(legend("sluice-gw-1321ca81b33d"), "sluice-gw-1321ca…");
    }

    #[test]
    fn history_is_bounded() {
        let page = Page::new(Duration::from_secs(5), 3);
        for i in 0..10 {
            let mut s = sample();
            s.now_ms = i;
            page.record(Ok(s));
        }
        page.record(Err(anyhow::anyhow!("meta unreachable")));
        let state = page.lock();
        assert_eq!(state.history.len(), 3);
        assert_eq!(state.history.front().unwrap().at_ms, 7);
        assert_eq!(state.error.as_deref(), Some("meta unreachable"));
        assert_eq!(state.latest.as_ref().unwrap().now_ms, 9);
    }

    #[test]
    fn page_shows_nodes_states_memory_and_escapes_names() {
        let page = Page::new(Duration::from_secs(5), 10);
        let mut first = sample();
        first.gateways[0].gateway_id = "gw-<1>".into();
        first.gateways[0].slowdowns_total = 3;
        page.record(Ok(first.clone()));
        let mut second = first.clone();
        second.now_ms += 5_000;
        second.gateways[0].requests_total += 100;
        second.gateways[0].slowdowns_total += 20;
        page.record(Ok(second));
        let html = answer(&page, &Method::GET, "/");
        assert_eq!(html.status(), StatusCode::OK);
        let state = page.lock();
        let text = render_page(&state, Duration::from_secs(5));
        assert!(text.contains("<meta http-equiv=\"refresh\" content=\"5\">"));
        assert!(text.contains("node 1 · term 3"), "leader tile");
        assert!(
            text.contains("<b class=\"bad\">1 / 2</b>"),
            "one datanode down"
        );
        assert!(text.contains("<td class=\"bad\">down</td>"));
        assert!(
            text.contains("100.0 MiB / 64.0 MiB"),
            "datanode RSS / budgets"
        );
        assert!(
            text.contains("1.0 MiB / 64.0 MiB"),
            "credit in use / budget"
        );
        assert!(text.contains("gw-&lt;1&gt;"), "names are escaped");
        assert!(!text.contains("gw-<1>"));
        // 20 SlowDowns of 100 requests in 5 s.
        assert!(text.contains("4.0/s · 20.0 %"), "{text}");
        assert_eq!(text.matches("<svg ").count(), 3);
        assert!(text.contains("<polyline"));
    }

    #[test]
    fn before_the_first_answer_the_page_says_why() {
        let page = Page::new(Duration::from_secs(5), 10);
        page.record(Err(anyhow::anyhow!("connection refused")));
        let text = render_page(&page.lock(), Duration::from_secs(5));
        assert!(text.contains("No answer from the meta cluster yet: connection refused"));
        assert_eq!(
            answer(&page, &Method::POST, "/").status(),
            StatusCode::METHOD_NOT_ALLOWED
        );
        assert_eq!(
            answer(&page, &Method::GET, "/nope").status(),
            StatusCode::NOT_FOUND
        );
    }
}
