//! `/api/v1/regions…`: the regions registry, each region's weight and state
//! as the allocator splits global limits between them.

use axum::Json;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::Api;
use super::auth::{Admin, AdminBody, parse_json};
use super::errors::{ApiError, ApiResult};
use super::read::Read;
use super::write::commit;
use crate::clock::now_unix_ms;
use crate::coordinator::state::{Command, RegionState};

/// `GET /api/v1/regions`.
pub(super) async fn list_regions(read: Read) -> Response {
    let regions: Vec<&_> = read.state.registry.regions.values().collect();
    Json(json!({ "consistency": read.consistency, "regions": regions })).into_response()
}

/// `GET /api/v1/regions/{name}`.
pub(super) async fn get_region(Path(name): Path<String>, read: Read) -> Response {
    match read.state.registry.regions.get(&name) {
        Some(r) => Json(json!({ "consistency": read.consistency, "region": r })).into_response(),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            format!("region {name:?} does not exist"),
        )
        .into_response(),
    }
}

/// The body of `PUT /api/v1/regions/{name}`; `{}` makes an active region of
/// weight 1.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegionBody {
    #[serde(default = "default_weight")]
    weight: f64,
    #[serde(default = "default_region_state")]
    state: RegionState,
}

fn default_weight() -> f64 {
    1.0
}

fn default_region_state() -> RegionState {
    RegionState::Active
}

/// Refuses a region name limiters could not report under, naming `field`
/// (the path's `name`, a drill body's `region`).
pub(super) fn check_region_name(name: &str, field: &str) -> Result<(), ApiError> {
    if crate::allocation::valid_region_name(name) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("region name {name:?} must be 1–64 characters of a-z, 0-9, '-' or '_'"),
        )
        .with("field", json!(field)))
    }
}

/// `PUT /api/v1/regions/{name}`: creates the region or replaces its weight
/// and state.
pub(super) async fn put_region(
    State(api): State<Api>,
    Path(name): Path<String>,
    headers: HeaderMap,
    AdminBody(bytes): AdminBody,
) -> ApiResult {
    check_region_name(&name, "name")?;
    let b: RegionBody = parse_json(&bytes)?;
    if !(b.weight.is_finite() && b.weight > 0.0) {
        return Err(ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("weight must be a positive number, got {}", b.weight),
        )
        .with("field", json!("weight")));
    }
    commit(
        &api,
        &headers,
        Command::PutRegion {
            name,
            weight: b.weight,
            state: b.state,
            at_unix_ms: now_unix_ms(),
        },
    )
    .await
}

/// `DELETE /api/v1/regions/{name}`.
pub(super) async fn delete_region(
    State(api): State<Api>,
    Path(name): Path<String>,
    headers: HeaderMap,
    _admin: Admin,
) -> ApiResult {
    commit(&api, &headers, Command::DeleteRegion { name }).await
}
