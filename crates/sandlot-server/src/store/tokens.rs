//! API tokens: a tenant's, or the operator's for the TCP listener. The
//! database keeps a token's sha256 only; its secret is shown once, at creation.

use rusqlite::{params, Connection, OptionalExtension};
use serde::{Deserialize, Serialize};

use super::{now_ms, sql, Store, StoreError};

/// What a token grants: a tenant's view, or the operator's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TokenKind {
    /// Acts as its tenant only.
    Tenant,
    /// The operator's principal over TCP (every tenant), short of what stays on
    /// the Unix socket (`docs/threat-model.md`, "Operator tokens").
    Operator,
}

impl TokenKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::Tenant => "tenant",
            TokenKind::Operator => "operator",
        }
    }

    fn parse(s: &str) -> Option<TokenKind> {
        match s {
            "tenant" => Some(TokenKind::Tenant),
            "operator" => Some(TokenKind::Operator),
            _ => None,
        }
    }
}

/// The tenant an operator token's record names: no tenant's name (`*` is not a
/// valid tenant), as `GET /v1/health` names the operator.
pub const OPERATOR_TOKEN_TENANT: &str = "*";

/// A token as listed (never its secret).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenRecord {
    pub id: String,
    pub kind: TokenKind,
    /// The tenant a tenant token acts as; [`OPERATOR_TOKEN_TENANT`] for an
    /// operator token.
    pub tenant: String,
    pub name: Option<String>,
    pub created_at: i64,
    pub last_used_at: Option<i64>,
    pub revoked_at: Option<i64>,
    /// Who minted it: the minting operator token's id, or `socket`; None for a
    /// token made before tokens recorded their maker.
    pub created_by: Option<String>,
}

/// What a valid token grants: its id, kind and tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub id: String,
    pub kind: TokenKind,
    pub tenant: String,
}

/// What a revoke did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoke {
    /// Revoked, with this many tokens it had minted.
    Revoked { minted: usize },
    /// No such live token.
    NotFound,
    /// A live operator token, and the caller may revoke tenant tokens only.
    OperatorToken,
}

impl Store {
    /// Stores a token (its sha256 hash only).
    pub fn insert_token(&self, t: &TokenRecord, hash: &str) -> Result<(), StoreError> {
        self.lock()
            .execute(
                "INSERT INTO tokens (id, kind, tenant, name, hash, created_at, created_by) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
                params![t.id, t.kind.as_str(), t.tenant, t.name, hash, t.created_at, t.created_by],
            )
            .map_err(sql("insert token"))?;
        Ok(())
    }

    /// The kind and tenant of a valid (not revoked) token with this hash.
    /// Records its use. The hash is looked up by SQLite's index, never compared
    /// in Rust: what a caller's timing could learn is about the hash of what it
    /// sent, not about a stored secret.
    pub fn token_grant(&self, hash: &str) -> Result<Option<Grant>, StoreError> {
        let c = self.lock();
        let row: Option<(String, String, String, Option<i64>)> = c
            .query_row(
                "SELECT id, kind, tenant, last_used_at FROM tokens WHERE hash = ?1 AND revoked_at IS NULL",
                [hash],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)),
            )
            .optional()
            .map_err(sql("look up token"))?;
        let Some((id, kind, tenant, last)) = row else {
            return Ok(None);
        };
        // A kind this daemon does not know grants nothing.
        let Some(kind) = TokenKind::parse(&kind) else {
            return Ok(None);
        };
        let now = now_ms();
        // Coarse, so that hot paths do not write on every request.
        if last.is_none_or(|l| now - l > 60_000) {
            c.execute(
                "UPDATE tokens SET last_used_at = ?1 WHERE id = ?2",
                params![now, id],
            )
            .map_err(sql("record token use"))?;
        }
        Ok(Some(Grant { id, kind, tenant }))
    }

    /// The tenant of a valid (not revoked) tenant token with this hash: what the
    /// front doors that admit tenants only (E2B's) accept; an operator token is
    /// not one. Records its use.
    pub fn tenant_of_token(&self, hash: &str) -> Result<Option<String>, StoreError> {
        Ok(self
            .token_grant(hash)?
            .and_then(|g| (g.kind == TokenKind::Tenant).then_some(g.tenant)))
    }

    pub fn list_tokens(&self) -> Result<Vec<TokenRecord>, StoreError> {
        let c = self.lock();
        let mut st = c
            .prepare("SELECT id, kind, tenant, name, created_at, last_used_at, revoked_at, created_by FROM tokens ORDER BY created_at, id")
            .map_err(sql("list tokens"))?;
        let rows = st
            .query_map([], |r| {
                let kind: String = r.get(1)?;
                Ok(TokenRecord {
                    id: r.get(0)?,
                    // Listed as the operator's when unknown: the stronger kind,
                    // so that nobody mistakes it for a tenant's.
                    kind: TokenKind::parse(&kind).unwrap_or(TokenKind::Operator),
                    tenant: r.get(2)?,
                    name: r.get(3)?,
                    created_at: r.get(4)?,
                    last_used_at: r.get(5)?,
                    revoked_at: r.get(6)?,
                    created_by: r.get(7)?,
                })
            })
            .map_err(sql("list tokens"))?;
        rows.collect::<Result<_, _>>().map_err(sql("list tokens"))
    }

    /// The token `id`, revoked or not.
    pub fn token(&self, id: &str) -> Result<Option<TokenRecord>, StoreError> {
        Ok(self.list_tokens()?.into_iter().find(|t| t.id == id))
    }

    /// Revokes the live token `id` and, in the same transaction, every live
    /// token it minted (an operator token's tenant tokens): nothing a leaked
    /// operator token made outlives its revocation. With `operator_tokens`
    /// false (any caller but the Unix socket), the UPDATE itself spares
    /// operator tokens, so that no check races the act.
    pub fn revoke_token(&self, id: &str, operator_tokens: bool) -> Result<Revoke, StoreError> {
        let mut c = self.lock();
        let tx = c.transaction().map_err(sql("revoke token"))?;
        let now = now_ms();
        let n = tx
            .execute(
                "UPDATE tokens SET revoked_at = ?1 WHERE id = ?2 AND revoked_at IS NULL \
                 AND (?3 OR kind = 'tenant')",
                params![now, id, operator_tokens],
            )
            .map_err(sql("revoke token"))?;
        if n == 0 {
            let live_operator: bool = tx
                .query_row(
                    "SELECT EXISTS (SELECT 1 FROM tokens WHERE id = ?1 AND revoked_at IS NULL)",
                    [id],
                    |r| r.get(0),
                )
                .map_err(sql("revoke token"))?;
            return Ok(if live_operator {
                Revoke::OperatorToken
            } else {
                Revoke::NotFound
            });
        }
        let minted = tx
            .execute(
                "UPDATE tokens SET revoked_at = ?1 WHERE created_by = ?2 AND revoked_at IS NULL",
                params![now, id],
            )
            .map_err(sql("revoke the tokens a token minted"))?;
        tx.commit().map_err(sql("revoke token"))?;
        Ok(Revoke::Revoked { minted })
    }
}

/// Adds `tokens.created_by` to a database made before tokens recorded their
/// maker: its tokens' maker is unknown (NULL).
pub(super) fn add_token_created_by(c: &Connection) -> Result<(), StoreError> {
    add_token_column(c, "created_by", "created_by TEXT")
}

/// Adds `tokens.kind` to a database made before operator tokens: its tokens
/// are tenants' (the column's default).
pub(super) fn add_token_kind(c: &Connection) -> Result<(), StoreError> {
    add_token_column(c, "kind", "kind TEXT NOT NULL DEFAULT 'tenant'")
}

/// Adds the column `name` (declared as `declaration`) to `tokens` unless the
/// table has it already.
fn add_token_column(c: &Connection, name: &str, declaration: &str) -> Result<(), StoreError> {
    let has: bool = c
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM pragma_table_info('tokens') WHERE name = ?1)",
            [name],
            |r| r.get(0),
        )
        .map_err(sql("read the tokens table"))?;
    if !has {
        c.execute_batch(&format!("ALTER TABLE tokens ADD COLUMN {declaration}"))
            .map_err(sql("add a column to tokens"))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(id: &str, kind: TokenKind, tenant: &str) -> TokenRecord {
        TokenRecord {
            id: id.into(),
            kind,
            tenant: tenant.into(),
            name: Some("ci".into()),
            created_at: now_ms(),
            last_used_at: None,
            revoked_at: None,
            created_by: Some("socket".into()),
        }
    }

    #[test]
    fn tokens_are_found_by_hash_and_revocable() {
        let s = Store::in_memory().unwrap();
        s.insert_token(&token("tok1", TokenKind::Tenant, "acme"), "h1")
            .unwrap();
        assert_eq!(s.tenant_of_token("h1").unwrap().as_deref(), Some("acme"));
        assert_eq!(s.tenant_of_token("h2").unwrap(), None);
        assert!(s.list_tokens().unwrap()[0].last_used_at.is_some());
        assert_eq!(
            s.revoke_token("tok1", false).unwrap(),
            Revoke::Revoked { minted: 0 }
        );
        assert_eq!(s.revoke_token("tok1", false).unwrap(), Revoke::NotFound);
        assert_eq!(s.tenant_of_token("h1").unwrap(), None);
    }

    #[test]
    fn an_operator_token_grants_the_operator_kind_and_no_tenant_and_is_revocable() {
        let s = Store::in_memory().unwrap();
        s.insert_token(
            &token("tok_op", TokenKind::Operator, OPERATOR_TOKEN_TENANT),
            "hop",
        )
        .unwrap();
        assert_eq!(
            s.token_grant("hop").unwrap(),
            Some(Grant {
                id: "tok_op".into(),
                kind: TokenKind::Operator,
                tenant: OPERATOR_TOKEN_TENANT.to_string()
            })
        );
        // The front doors that take tenants' tokens only do not take it.
        assert_eq!(s.tenant_of_token("hop").unwrap(), None);
        assert_eq!(s.list_tokens().unwrap()[0].kind, TokenKind::Operator);
        assert_eq!(
            s.token("tok_op").unwrap().unwrap().kind,
            TokenKind::Operator
        );
        assert_eq!(
            s.revoke_token("tok_op", true).unwrap(),
            Revoke::Revoked { minted: 0 }
        );
        assert_eq!(s.token_grant("hop").unwrap(), None);
    }

    #[test]
    fn revoking_an_operator_token_revokes_every_token_it_minted() {
        let s = Store::in_memory().unwrap();
        s.insert_token(&token("tok_op", TokenKind::Operator, "*"), "hop")
            .unwrap();
        let mut minted = token("tok_m", TokenKind::Tenant, "acme");
        minted.created_by = Some("tok_op".into());
        s.insert_token(&minted, "hm").unwrap();
        s.insert_token(&token("tok_s", TokenKind::Tenant, "acme"), "hs")
            .unwrap();
        assert_eq!(
            s.token("tok_m").unwrap().unwrap().created_by.as_deref(),
            Some("tok_op")
        );
        assert_eq!(
            s.revoke_token("tok_op", true).unwrap(),
            Revoke::Revoked { minted: 1 }
        );
        assert_eq!(s.token_grant("hm").unwrap(), None);
        // The socket's own tenant token lives on.
        assert!(s.token_grant("hs").unwrap().is_some());
    }

    #[test]
    fn a_revoke_by_other_than_the_socket_spares_operator_tokens_in_its_update() {
        let s = Store::in_memory().unwrap();
        s.insert_token(&token("tok_op", TokenKind::Operator, "*"), "hop")
            .unwrap();
        assert_eq!(
            s.revoke_token("tok_op", false).unwrap(),
            Revoke::OperatorToken
        );
        assert!(s.token_grant("hop").unwrap().is_some());
        assert_eq!(s.revoke_token("tok_none", false).unwrap(), Revoke::NotFound);
    }

    #[test]
    fn an_old_database_opened_by_the_store_gets_kind_and_maker_with_every_token_a_tenants() {
        let dir = std::env::temp_dir().join(format!("sandlot-old-db-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sandlot.db");
        {
            let c = Connection::open(&path).unwrap();
            c.execute_batch(
                "CREATE TABLE tokens (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, name TEXT,
                 hash TEXT NOT NULL UNIQUE, created_at INTEGER NOT NULL, last_used_at INTEGER,
                 revoked_at INTEGER);
                 INSERT INTO tokens (id, tenant, hash, created_at) VALUES ('tok_old', 'acme', 'hold', 1);",
            )
            .unwrap();
        }
        let s = Store::open(&path).unwrap();
        let t = s.token("tok_old").unwrap().unwrap();
        assert_eq!(t.kind, TokenKind::Tenant);
        assert_eq!(t.created_by, None);
        assert_eq!(s.tenant_of_token("hold").unwrap().as_deref(), Some("acme"));
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_database_made_before_token_kinds_keeps_its_tokens_as_tenants() {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(
            "CREATE TABLE tokens (id TEXT PRIMARY KEY, tenant TEXT NOT NULL, name TEXT,
             hash TEXT NOT NULL UNIQUE, created_at INTEGER NOT NULL, last_used_at INTEGER,
             revoked_at INTEGER);
             INSERT INTO tokens (id, tenant, hash, created_at) VALUES ('tok_old', 'acme', 'hold', 1);",
        )
        .unwrap();
        add_token_kind(&c).unwrap();
        add_token_kind(&c).unwrap();
        let kind: String = c
            .query_row("SELECT kind FROM tokens WHERE id = 'tok_old'", [], |r| {
                r.get(0)
            })
            .unwrap();
        assert_eq!(kind, "tenant");
    }

    #[test]
    fn a_token_of_an_unknown_kind_grants_nothing() {
        let s = Store::in_memory().unwrap();
        s.insert_token(&token("tok_x", TokenKind::Tenant, "acme"), "hx")
            .unwrap();
        s.lock()
            .execute("UPDATE tokens SET kind = 'root' WHERE id = 'tok_x'", [])
            .unwrap();
        assert_eq!(s.token_grant("hx").unwrap(), None);
        assert_eq!(s.list_tokens().unwrap()[0].kind, TokenKind::Operator);
    }
}
