//! Who a SQL client is. Without users (`chorus_auth::Users::open_to_anyone`), everyone is let
//! in with every right, as before. With them, a client logs in with SCRAM-SHA-256 as one of
//! the node's users (the same users as its RESP port: `requirepass` is user `default`'s
//! password), against that user's first password given in the clear; failed logins are
//! throttled per client address and counted; and the session learns its user's rights once
//! logged in.

use std::fmt::Debug;
use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use chorus_auth::{Rights, Users, SCRAM_ITERATIONS};
use futures::Sink;
use pgwire::api::auth::sasl::scram::ScramAuth;
use pgwire::api::auth::sasl::SASLAuthStartupHandler;
use pgwire::api::auth::{AuthSource, DefaultServerParameterProvider, LoginInfo, Password, StartupHandler};
use pgwire::api::{ClientInfo, ErrorHandler, PgWireConnectionState, METADATA_USER};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};

use super::Session;

/// The node's users and what their logins have done lately.
pub type Logins = chorus_auth::Logins;

/// None when anyone may connect without a password and write: nothing to check.
pub fn logins(users: Arc<Users>) -> Option<Arc<Logins>> {
    if users.open_to_anyone() {
        return None;
    }
    Some(Arc::new(Logins::new(
        users,
        "chorus_sql_login_failures_total",
        "PostgreSQL logins refused, by why",
    )))
}

/// SCRAM's view of the users: each one's salt and salted password.
#[derive(Clone)]
struct ScramSource(Arc<Logins>);

impl Debug for ScramSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ScramSource")
    }
}

#[async_trait]
impl AuthSource for ScramSource {
    async fn get_password(&self, login: &LoginInfo) -> PgWireResult<Password> {
        let logins = &self.0;
        if let Ok(address) = login.host().parse::<IpAddr>() {
            if let Some(wait) = logins.must_wait(address) {
                return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                    "FATAL".into(),
                    "28000".into(),
                    format!(
                        "too many failed logins from {address}: try again in {} ms",
                        wait.as_millis().max(1)
                    ),
                ))));
            }
        }
        // An unknown or disabled user, or one with no password in the clear, gets a decoy no
        // password matches: the client learns only that the login failed.
        let (secret, _) = logins.users().scram_secret(login.user().unwrap_or(""));
        Ok(Password::new(
            Some(secret.salt.to_vec()),
            secret.salted_password.to_vec(),
        ))
    }
}

/// The start of a connection: SCRAM when the node has users, nothing otherwise; then the
/// session takes its user's rights.
pub struct Login {
    session: Arc<Session>,
    logins: Option<Arc<Logins>>,
    sasl: Option<SASLAuthStartupHandler<DefaultServerParameterProvider>>,
}

impl Login {
    pub fn new(session: Arc<Session>, logins: Option<Arc<Logins>>) -> Login {
        let sasl = logins.as_ref().map(|logins| {
            let mut scram = ScramAuth::new(Arc::new(ScramSource(logins.clone())));
            scram.set_iterations(SCRAM_ITERATIONS as usize);
            SASLAuthStartupHandler::new(Arc::new(DefaultServerParameterProvider::default())).with_scram(scram)
        });
        Login { session, logins, sasl }
    }
}

#[async_trait]
impl StartupHandler for Login {
    async fn on_startup<C>(&self, client: &mut C, message: PgWireFrontendMessage) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let (Some(sasl), Some(logins)) = (&self.sasl, &self.logins) else {
            return self.session.on_startup(client, message).await;
        };
        sasl.on_startup(client, message).await?;
        if matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            let rights = client
                .metadata()
                .get(METADATA_USER)
                .and_then(|name| logins.users().get(name))
                .map_or(Rights::None, |user| user.rights);
            self.session.logged_in(rights);
            logins.succeeded(client.socket_addr().ip());
        }
        Ok(())
    }
}

impl ErrorHandler for Login {
    fn on_error<C>(&self, client: &C, error: &mut PgWireError)
    where
        C: ClientInfo,
    {
        let Some(logins) = &self.logins else {
            return;
        };
        if let PgWireError::InvalidPassword(user) = error {
            logins.failed(client.socket_addr().ip());
            tracing::info!(remote = %client.socket_addr(), user = %user, "SQL login refused");
        }
    }
}
