//! Phase 5, train: the datums go to the backend — every `forward_backward` and
//! `optim_step` of the update submitted in order (optimizer steps before the gradients are
//! awaited), then every result awaited at once (combined in submission order). What this phase hands to the
//! [log](super::log) phase is a [`TrainOutcome`] (none when there was nothing to train).

use std::collections::BTreeMap;
use std::future::IntoFuture;

use crate::backend::{Pending, PolicyBackend};
use crate::error::Result;
use crate::loss::{CustomLoss, forward_backward_custom};
use crate::report::PhaseBar;
use crate::types::{ForwardBackwardOutput, OptimStepOutput};

use super::config::TrainerConfig;
use super::datums::{TrainDatum, chunk_bounds};

/// `forward_backward`s already submitted (streamed minibatches), with the datum range each
/// covered.
pub(crate) type Submitted = Vec<(std::ops::Range<usize>, Pending<ForwardBackwardOutput>)>;

/// Phase 5 of a step: the update over `data`. With `submitted` (streamed minibatches, whose
/// `forward_backward`s went out during the rollout) only the `optim_step` is left to submit.
/// With `custom`, each minibatch runs [`forward_backward_custom`] instead of the built-in
/// `config.loss` (the trainer refuses it with streamed minibatches). `None` when there is
/// nothing to train (no datum: every group skipped).
pub(crate) async fn update<B: PolicyBackend>(
    backend: &B,
    data: &mut [TrainDatum],
    submitted: Option<Submitted>,
    config: &TrainerConfig,
    custom: Option<&dyn CustomLoss>,
    bar: &PhaseBar,
) -> Result<Option<TrainOutcome>> {
    let adam = config.adam();
    if let Some(fb) = submitted {
        // Streaming: every forward_backward is already submitted.
        if fb.is_empty() {
            return Ok(None);
        }
        let opt = backend.optim_step(adam).await?;
        finish_update(fb, vec![opt], data.len(), bar)
            .await
            .map(Some)
    } else if data.is_empty() {
        Ok(None)
    } else {
        train(
            backend,
            data,
            custom.map_or(Loss::BuiltIn(config.loss), Loss::Custom),
            adam,
            config.num_substeps,
            config.num_minibatches,
            bar,
        )
        .await
        .map(Some)
    }
}

/// The loss an update runs.
#[derive(Clone, Copy)]
enum Loss<'a> {
    BuiltIn(crate::types::LossFn),
    Custom(&'a dyn CustomLoss),
}

/// What one pipelined update returned.
pub(crate) struct TrainOutcome {
    /// The learner's log-probabilities per datum (when the backend returned them).
    pub train_logprobs: Vec<Option<Vec<f32>>>,
    /// The `forward_backward` metrics over the update's calls: `:mean` keys averaged, the
    /// others summed (`loss:sum`...).
    pub loss_metrics: BTreeMap<String, f64>,
    /// The last `optim_step`'s metrics.
    pub optim_metrics: BTreeMap<String, f64>,
    /// Optimizer steps taken.
    pub updates: usize,
}

/// Submits every `forward_backward` and `optim_step` of the update in order (datums cut into
/// `num_substeps` chunks, each chunk into `num_minibatches` forward/backward calls followed
/// by one optimizer step), then awaits every result at once.
///
/// A custom loss runs each minibatch to completion (forward pass, loss, backward pass) before
/// the next is submitted; the optimizer step follows its substep's last minibatch.
///
/// Each [`TrainDatum`]'s `datum` is moved into its request (left empty here): what the step
/// reads afterwards is the mask and the sampler's log-probs, and a copy of every datum's
/// tensors per update is what this saves.
async fn train<B: PolicyBackend>(
    backend: &B,
    data: &mut [TrainDatum],
    loss: Loss<'_>,
    adam: crate::types::AdamParams,
    num_substeps: usize,
    num_minibatches: usize,
    bar: &PhaseBar,
) -> Result<TrainOutcome> {
    let mut fb: Vec<(std::ops::Range<usize>, Pending<ForwardBackwardOutput>)> = Vec::new();
    let mut opt: Vec<Pending<OptimStepOutput>> = Vec::new();
    for chunk in chunk_bounds(data.len(), num_substeps) {
        for mb in chunk_bounds(chunk.len(), num_minibatches) {
            let range = chunk.start + mb.start..chunk.start + mb.end;
            let datums = data[range.clone()]
                .iter_mut()
                .map(|d| std::mem::take(&mut d.datum))
                .collect();
            let pending = match loss {
                Loss::BuiltIn(loss) => backend.forward_backward(datums, loss).await?,
                Loss::Custom(loss) => {
                    Pending::ready(forward_backward_custom(backend, datums, loss).await)
                }
            };
            fb.push((range, pending));
        }
        opt.push(backend.optim_step(adam).await?);
    }
    finish_update(fb, opt, data.len(), bar).await
}

/// Awaits submitted `forward_backward`s (with the datum range each covered) and
/// `optim_step`s, all at once: every result is polled concurrently (a remote backend's
/// long-polls overlap, so an update costs one round trip after its last submission, not one
/// per request), and the outputs are combined in submission order.
async fn finish_update(
    fb: Submitted,
    opt: Vec<Pending<OptimStepOutput>>,
    n_data: usize,
    bar: &PhaseBar,
) -> Result<TrainOutcome> {
    let updates = opt.len();
    let (ranges, fb_pending): (Vec<_>, Vec<_>) = fb.into_iter().unzip();
    let opt_all = futures::future::try_join_all(opt.into_iter().map(|pending| async move {
        let out = pending.into_future().await?;
        bar.inc(1);
        Ok::<_, crate::error::Error>(out)
    }));
    let (fb_outs, opt_outs) = futures::future::try_join(
        futures::future::try_join_all(fb_pending.into_iter().map(IntoFuture::into_future)),
        opt_all,
    )
    .await?;
    let mut train_logprobs = vec![None; n_data];
    let mut loss_metrics = BTreeMap::new();
    let mut mean_counts: BTreeMap<String, usize> = BTreeMap::new();
    for (range, out) in ranges.into_iter().zip(fb_outs) {
        let range = range.start.min(n_data)..range.end.min(n_data);
        for (slot, o) in train_logprobs[range].iter_mut().zip(&out.loss_fn_outputs) {
            *slot = o
                .get(ForwardBackwardOutput::LOGPROBS)
                .and_then(|t| t.as_f32())
                .map(<[f32]>::to_vec);
        }
        for (k, v) in out.metrics {
            if k.ends_with(":mean") {
                *mean_counts.entry(k.clone()).or_insert(0) += 1;
            }
            *loss_metrics.entry(k).or_insert(0.0) += v;
        }
    }
    for (k, n) in mean_counts {
        if let Some(v) = loss_metrics.get_mut(&k) {
            *v /= n as f64;
        }
    }
    let optim_metrics = opt_outs
        .into_iter()
        .last()
        .map(|o| o.metrics)
        .unwrap_or_default();
    Ok(TrainOutcome {
        train_logprobs,
        loss_metrics,
        optim_metrics,
        updates,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Progress, ProgressMode};

    /// The update's results are awaited together: here the `forward_backward` result only
    /// arrives once the `optim_step` result is being awaited (as with a remote backend
    /// answering long-polls in any order), which awaiting in submission order would never
    /// reach.
    #[tokio::test]
    async fn results_are_awaited_together() {
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let fb = Pending::new(async move {
            rx.await
                .map_err(|_| crate::error::Error::Backend("never signalled".into()))?;
            Ok(ForwardBackwardOutput {
                metrics: [("loss:sum".to_string(), 2.0)].into(),
                ..ForwardBackwardOutput::default()
            })
        });
        let opt = Pending::new(async move {
            let _ = tx.send(());
            Ok(OptimStepOutput {
                metrics: [("lr".to_string(), 0.5)].into(),
            })
        });
        let progress = Progress::with_mode(1, ProgressMode::Hidden);
        let bar = progress.phase("training", 1);
        let out = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            finish_update(vec![(0..1, fb)], vec![opt], 1, &bar),
        )
        .await
        .expect("awaited one after the other: deadlock")
        .expect("update");
        assert_eq!(out.loss_metrics["loss:sum"], 2.0);
        assert_eq!(out.optim_metrics["lr"], 0.5);
        assert_eq!(out.updates, 1);
    }
}
