//! The validating admission webhook on Barriers ([`PATH`]): a Barrier
//! written by hand whose `spec.after` makes a cycle with the Barriers there
//! now (or reaches too many of them to tell), or that asks for `after` with
//! `onParticipantLoss: RestartGang`, is refused at `kubectl apply`, with
//! the chain named.
//!
//! It is advice, not the guarantee: the chart registers it with
//! `failurePolicy: Ignore`, and the controller fails a cycle whatever
//! admission said (the controller's `after`). So a webhook that is
//! down never blocks a Barrier's creation, nor the controller's own
//! updates (its finalizer goes on and comes off through the same
//! resource), and a cycle made of two Barriers admitted at the same
//! moment, each before the other existed, is still failed by the
//! controller. A Barrier whose `after` cannot be read is admitted, for the
//! same reason, and so is one the controller makes for a labelled Job
//! (labelled [`crate::workload::managed_by`]): its pods' admission
//! checked the annotation it comes from, and refusing it would leave the
//! Job's pods waiting for a Barrier never made, where the controller
//! fails the cycle and tells them. Like the pod webhook, it writes nothing.

use std::sync::Arc;

use axum::extract::State;
use axum::Json;
use kube::api::Api;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview};
use kube::core::DynamicObject;
use kube::ResourceExt;
use tracing::{info, warn};

use super::Webhook;
use crate::api::{Barrier, OnParticipantLoss};
use crate::workload::after;

/// Where the API server sends Barriers' reviews.
pub const PATH: &str = "/validate/barriers";

/// Answers one review of a Barrier's creation or update.
pub(super) async fn validate(
    State(hook): State<Arc<Webhook>>,
    Json(review): Json<AdmissionReview<Barrier>>,
) -> Json<AdmissionReview<DynamicObject>> {
    let request: AdmissionRequest<Barrier> = match review.try_into() {
        Ok(r) => r,
        Err(e) => return Json(AdmissionResponse::invalid(e.to_string()).into_review()),
    };
    Json(hook.admit_barrier(&request).await.into_review())
}

impl Webhook {
    async fn admit_barrier(&self, request: &AdmissionRequest<Barrier>) -> AdmissionResponse {
        let response = AdmissionResponse::from(request);
        let Some(barrier) = &request.object else {
            return response;
        };
        // Going away (its finalizer coming off): nothing to start after.
        if barrier.metadata.deletion_timestamp.is_some() {
            return response;
        }
        let namespace = request
            .namespace
            .clone()
            .or_else(|| barrier.namespace())
            .unwrap_or_default();
        if self.scope.as_ref().is_some_and(|scope| *scope != namespace) {
            return response;
        }
        // The controller's own, for a labelled Job (see the module's doc).
        if crate::workload::made_by_zkgate(&barrier.metadata) {
            return response;
        }
        // An update that leaves `after` and the policy as they were asks
        // nothing new (the controller's finalizer, labels, a count).
        if let Some(old) = &request.old_object {
            if old.spec.after == barrier.spec.after
                && old.spec.on_participant_loss == barrier.spec.on_participant_loss
            {
                return response;
            }
        }
        let name = barrier.name_any();
        match self.refusal(&namespace, barrier).await {
            Ok(None) => response,
            Ok(Some(why)) => {
                info!(%namespace, barrier = %name, reason = %why, "refused a Barrier");
                response.deny(why)
            }
            Err(e) => {
                warn!(%namespace, barrier = %name, error = %e, "cannot read the Barriers its after names: admitted, the controller checks it");
                response
            }
        }
    }

    /// Why `barrier` must be refused, if it must.
    async fn refusal(
        &self,
        namespace: &str,
        barrier: &Barrier,
    ) -> Result<Option<String>, kube::Error> {
        if barrier.spec.after.is_empty() {
            return Ok(None);
        }
        if barrier.spec.on_participant_loss == OnParticipantLoss::RestartGang {
            return Ok(Some(
                "spec.after cannot be combined with onParticipantLoss: RestartGang yet (a gang that restarts in rounds is not held by another's): drop one of them".to_owned(),
            ));
        }
        let api: Api<Barrier> = Api::namespaced(self.client.clone(), namespace);
        let chain = after::cycle_of(&api, barrier, &mut Default::default()).await?;
        Ok(chain
            .refusal()
            .map(|why| format!("spec.after, with the Barriers there now, {why}")))
    }
}
