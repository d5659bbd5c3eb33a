//! What the worker keeps of its windows in the `session` store (contract 5, r4), beside
//! the session and with no schema change: the account each window named last
//! (`window:<client id>`), and the `MUTATION_SETTLED` reports kept for an account none of
//! whose windows was open when its write was answered (`settled:<account>`). Neither is
//! cached in memory (read at each use), so two workers sharing the database (an old and
//! a new version) agree without the generation; `CLEAR_DEVICE` deletes both with the
//! session.

use super::idb::{done, failed, request, IdbError};
use super::{finish, Store, TxEnd, SESSION};
use crate::core::windows::{keep_newest, Named, KEPT_SETTLED_ACCOUNTS};
use js_sys::{Array, Object, Reflect};
use wasm_bindgen::prelude::*;
use web_sys::{IdbKeyRange, IdbTransactionMode};

const WINDOW_PREFIX: &str = "window:";
const SETTLED_PREFIX: &str = "settled:";

/// Every key of the session store that starts with `prefix`.
fn range(prefix: &str) -> Result<JsValue, IdbError> {
    IdbKeyRange::bound(
        &JsValue::from_str(prefix),
        &JsValue::from_str(&format!("{prefix}\u{ffff}")),
    )
    .map(Into::into)
    .map_err(failed)
}

fn text(v: &JsValue, field: &str) -> Option<String> {
    Reflect::get(v, &field.into()).ok()?.as_string()
}

/// One account's kept reports, as stored.
pub struct Kept {
    pub account: String,
    pub reports: Vec<JsValue>,
}

impl Store {
    /// Records the account a window named (`None`: it signed out). Not strict: a lost
    /// row only makes that window another account's until it names its own again.
    pub async fn name_window(&self, client_id: &str, user: Option<&str>) -> Result<(), IdbError> {
        let v = Object::new();
        let key = format!("{WINDOW_PREFIX}{client_id}");
        Reflect::set(&v, &"key".into(), &key.into()).map_err(failed)?;
        Reflect::set(&v, &"clientId".into(), &client_id.into()).map_err(failed)?;
        let u = user.map(JsValue::from_str).unwrap_or(JsValue::NULL);
        Reflect::set(&v, &"userId".into(), &u).map_err(failed)?;
        self.put_session_value(&v.into(), false).await.map(drop)
    }

    /// Every window's named account, as kept. A row that cannot be read is skipped (the
    /// window is then of no known account).
    pub async fn named_windows(&self) -> Result<Vec<Named>, IdbError> {
        let tx = self.tx(&[SESSION], IdbTransactionMode::Readonly, false)?;
        let store = Self::store(&tx, SESSION)?;
        let all = request(
            store
                .get_all_with_key(&range(WINDOW_PREFIX)?)
                .map_err(failed)?,
        )
        .await?;
        Ok(Array::from(&all)
            .iter()
            .filter_map(|row| {
                let client_id = text(&row, "clientId")?;
                let user = Reflect::get(&row, &"userId".into()).ok()?;
                let user = match user.as_string() {
                    Some(u) if crate::core::identity::is_account_id(&u) => Some(u),
                    Some(_) => return None,
                    None if user.is_null() => None,
                    None => return None,
                };
                Some(Named { client_id, user })
            })
            .collect())
    }

    /// Deletes the rows of windows that are gone.
    pub async fn forget_windows(&self, client_ids: &[&str]) -> Result<(), IdbError> {
        if client_ids.is_empty() {
            return Ok(());
        }
        let tx = self.tx(&[SESSION], IdbTransactionMode::Readwrite, false)?;
        let committed = done(&tx);
        let work = async {
            let store = Self::store(&tx, SESSION)?;
            let mut last = None;
            for id in client_ids {
                let key = JsValue::from_str(&format!("{WINDOW_PREFIX}{id}"));
                last = Some(request(store.delete(&key).map_err(failed)?));
            }
            if let Some(l) = last {
                l.await?;
            }
            Ok(TxEnd::Commit(()))
        }
        .await;
        finish(&tx, committed, work).await
    }

    /// The accounts that have reports kept.
    pub async fn kept_accounts(&self) -> Result<Vec<String>, IdbError> {
        let tx = self.tx(&[SESSION], IdbTransactionMode::Readonly, false)?;
        let store = Self::store(&tx, SESSION)?;
        let keys = request(
            store
                .get_all_keys_with_key(&range(SETTLED_PREFIX)?)
                .map_err(failed)?,
        )
        .await?;
        Ok(Array::from(&keys)
            .iter()
            .filter_map(|k| {
                k.as_string()?
                    .strip_prefix(SETTLED_PREFIX)
                    .map(str::to_owned)
            })
            .collect())
    }

    /// Adds reports to their accounts' kept ones (the newest of each, and of the
    /// [`KEPT_SETTLED_ACCOUNTS`] accounts kept most recently), in one strict transaction: a
    /// write's answer is the app's only word of what the server did with it.
    pub async fn keep_settled(&self, now_ms: u64, new: Vec<Kept>) -> Result<(), IdbError> {
        if new.is_empty() {
            return Ok(());
        }
        let tx = self.tx(&[SESSION], IdbTransactionMode::Readwrite, true)?;
        let committed = done(&tx);
        let work = async {
            let store = Self::store(&tx, SESSION)?;
            let all = request(
                store
                    .get_all_with_key(&range(SETTLED_PREFIX)?)
                    .map_err(failed)?,
            )
            .await?;
            // (account, when last kept) of the rows there, to drop the stalest.
            let mut rows: Vec<(String, f64)> = Array::from(&all)
                .iter()
                .filter_map(|r| {
                    let at = Reflect::get(&r, &"at".into()).ok()?.as_f64().unwrap_or(0.0);
                    Some((text(&r, "userId")?, at))
                })
                .collect();
            for Kept { account, reports } in new {
                let key = format!("{SETTLED_PREFIX}{account}");
                let old = Array::from(&all)
                    .iter()
                    .find(|r| text(r, "key").as_deref() == Some(key.as_str()))
                    .and_then(|r| Reflect::get(&r, &"reports".into()).ok())
                    .filter(JsValue::is_object)
                    .map(|r| Array::from(&r).iter().collect::<Vec<_>>())
                    .unwrap_or_default();
                let mut kept = old;
                keep_newest(&mut kept, reports);
                let v = Object::new();
                Reflect::set(&v, &"key".into(), &key.into()).map_err(failed)?;
                Reflect::set(&v, &"userId".into(), &account.as_str().into()).map_err(failed)?;
                Reflect::set(&v, &"at".into(), &JsValue::from_f64(now_ms as f64))
                    .map_err(failed)?;
                let list: Array = kept.into_iter().collect();
                Reflect::set(&v, &"reports".into(), &list).map_err(failed)?;
                request(store.put(&v).map_err(failed)?).await?;
                rows.retain(|(a, _)| *a != account);
                rows.push((account, now_ms as f64));
            }
            // Too many accounts: the ones kept longest ago go (picked one by one, not
            // sorted: std's sort is several KB of the module for a list of 21).
            while rows.len() > KEPT_SETTLED_ACCOUNTS {
                let oldest = (0..rows.len())
                    .reduce(|a, b| if rows[b].1 < rows[a].1 { b } else { a })
                    .unwrap_or(0);
                let (account, _) = rows.swap_remove(oldest);
                let key = JsValue::from_str(&format!("{SETTLED_PREFIX}{account}"));
                request(store.delete(&key).map_err(failed)?).await?;
            }
            Ok(TxEnd::Commit(()))
        }
        .await;
        finish(&tx, committed, work).await
    }

    /// Takes (reads and deletes, in one transaction) the reports kept for `accounts`.
    pub async fn take_settled(&self, accounts: &[String]) -> Result<Vec<Kept>, IdbError> {
        if accounts.is_empty() {
            return Ok(Vec::new());
        }
        let tx = self.tx(&[SESSION], IdbTransactionMode::Readwrite, false)?;
        let committed = done(&tx);
        let work = async {
            let store = Self::store(&tx, SESSION)?;
            let mut out = Vec::new();
            for account in accounts {
                let key = JsValue::from_str(&format!("{SETTLED_PREFIX}{account}"));
                let row = request(store.get(&key).map_err(failed)?).await?;
                if !row.is_object() {
                    continue;
                }
                request(store.delete(&key).map_err(failed)?).await?;
                let reports = Reflect::get(&row, &"reports".into())
                    .ok()
                    .filter(JsValue::is_object)
                    .map(|r| Array::from(&r).iter().collect())
                    .unwrap_or_default();
                out.push(Kept {
                    account: account.clone(),
                    reports,
                });
            }
            Ok(TxEnd::Commit(out))
        }
        .await;
        finish(&tx, committed, work).await
    }
}
