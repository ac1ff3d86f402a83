//! [`MetricsSink`]: where the trainer sends its metrics rows besides `metrics.jsonl`.

use std::collections::BTreeMap;

use crate::error::Result;

/// A destination for the trainer's metrics besides `metrics.jsonl`: an experiment tracker,
/// a database, a dashboard. Register one with
/// [`GrpoTrainer::with_metrics_sink`](crate::GrpoTrainer::with_metrics_sink);
/// [`TensorBoardSink`](super::TensorBoardSink) (feature `tensorboard`) is one.
///
/// The trainer calls, in this order:
///
/// 1. [`start`](Self::start) once, when the run starts or resumes, with the run's
///    configuration (the content of `config.json`, secrets redacted) and the first step it
///    will log;
/// 2. [`log_metrics`](Self::log_metrics) for every row it appends to `metrics.jsonl`, right
///    after appending it, with the same step and the same values (the final evaluation's
///    row has `step = total_steps`);
/// 3. [`flush`](Self::flush) before each checkpoint is recorded and at the end of the run.
///
/// Rows come in increasing step order within one process. A resumed run (a new process)
/// starts again from its last checkpoint's step, so steps already sent by the run that
/// crashed are sent again: `start`'s `first_step` says from where (`metrics.jsonl` drops
/// its rows at or past that step too).
///
/// An error returned by any method stops the run, like a failed write to `metrics.jsonl`.
///
/// ```
/// use std::collections::BTreeMap;
/// use rlvr::report::MetricsSink;
///
/// /// Prints the train reward of every step.
/// struct PrintReward;
///
/// impl MetricsSink for PrintReward {
///     fn log_metrics(&mut self, step: u64, metrics: &BTreeMap<String, f64>) -> rlvr::Result<()> {
///         if let Some(r) = metrics.get("env/all/reward/total") {
///             println!("step {step}: reward {r:.3}");
///         }
///         Ok(())
///     }
/// }
///
/// let mut sink = PrintReward;
/// sink.start(&serde_json::json!({"batch_size": 16}), 0).unwrap();
/// sink.log_metrics(0, &BTreeMap::from([("env/all/reward/total".to_string(), 0.25)])).unwrap();
/// sink.flush().unwrap();
/// // let trainer = trainer.with_metrics_sink(PrintReward);
/// ```
pub trait MetricsSink: Send {
    /// Called once before the first row: `config` is the run's configuration as written to
    /// `config.json` (secrets redacted; the run metadata under `"run"`), `first_step` the
    /// first step this process will log (the resumed checkpoint's step, 0 for a new run).
    /// The default does nothing.
    fn start(&mut self, config: &serde_json::Value, first_step: u64) -> Result<()> {
        let _ = (config, first_step);
        Ok(())
    }

    /// One metrics row: every metric of step `step` (the row of `metrics.jsonl` without its
    /// `step` key).
    fn log_metrics(&mut self, step: u64, metrics: &BTreeMap<String, f64>) -> Result<()>;

    /// Makes what was logged so far durable, as far as the sink can: called before each
    /// checkpoint is recorded (a resume starts from that checkpoint) and at the end of the
    /// run. The default does nothing.
    fn flush(&mut self) -> Result<()> {
        Ok(())
    }
}
