//! The seeded templates every measurement copies (`CREATE DATABASE …
//! TEMPLATE … STRATEGY FILE_COPY`), and the backlogs measured on them.

use std::time::{Duration, Instant};

use anyhow::Result;
use booking_expiration::{
    db::{self, bookings, seed::SeedPlan},
    domain::Phase,
};
use chrono::{DateTime, Utc};
use diesel_async::{AsyncConnection, AsyncPgConnection, SimpleAsyncConnection};

use crate::{
    progress,
    support::{Services, db_settings},
};

/// A database seeded once and copied per measurement.
pub struct Template {
    pub name: String,
    /// The seed's `as_of`: the time of seeding.
    pub as_of: DateTime<Utc>,
    /// Bookings in the table.
    pub rows: u64,
}

/// A template at a point in time, with the rows due then.
#[derive(Clone, Copy)]
pub struct DueSet<'a> {
    pub template: &'a Template,
    pub as_of: DateTime<Utc>,
    pub due: u64,
}

/// Which backlog an expiry figure runs on.
#[derive(Clone, Copy, Debug)]
pub enum Backlog {
    /// 10k due among 100k rows (`tpl_10k` at its `as_of`).
    TenK,
    /// 100k due among 190k rows (`tpl_100k` at its `as_of`).
    HundredK,
    /// About 10k due among 1M rows (`tpl_1m` one day after its `as_of`).
    TenKOfOneM,
}

/// The templates of the run, with their due rows. `tpl_100k` and `tpl_1m`
/// are seeded only for the figures that run on them (idle, scaling).
pub struct Templates {
    pub t10k: Template,
    large: Option<Large>,
    due_10k: u64,
}

struct Large {
    t100k: Template,
    t1m: Template,
    due_100k: u64,
    due_1m_10k: u64,
}

impl Templates {
    /// Seeds the templates (the large two when `large`). The 10k and 100k
    /// sets keep their not-yet-due rows ten years out, so none becomes due
    /// during the run (the end-to-end run uses the real clock); the 1M set
    /// spreads them over 30 days so that one day later about 10k are due.
    pub async fn seed(svc: &Services, large: bool) -> Result<Self> {
        let now = crate::support::wall_now();
        if large {
            progress!("seeding templates (1M rows take a while)");
        } else {
            progress!("seeding tpl_10k (no figure of this run needs the larger templates)");
        }
        let t10k = build(svc, "tpl_10k", &plan(40_000, 10_000, 60_000, now, 3650)).await?;
        let due_10k = due_at(svc, &t10k.name, t10k.as_of).await?;
        let large = match large {
            true => {
                let t100k =
                    build(svc, "tpl_100k", &plan(130_000, 100_000, 60_000, now, 3650)).await?;
                let t1m = build(svc, "tpl_1m", &plan(300_000, 0, 700_000, now, 30)).await?;
                let due_100k = due_at(svc, &t100k.name, t100k.as_of).await?;
                let due_1m_10k = due_at(svc, &t1m.name, one_day_later(&t1m)).await?;
                progress!(
                    "due: {due_100k} in {}, {due_1m_10k} in {} one day later",
                    t100k.name,
                    t1m.name
                );
                Some(Large {
                    t100k,
                    t1m,
                    due_100k,
                    due_1m_10k,
                })
            }
            false => None,
        };
        progress!("due: {due_10k} in {}", t10k.name);
        Ok(Self {
            t10k,
            large,
            due_10k,
        })
    }

    fn large(&self) -> Result<&Large> {
        self.large
            .as_ref()
            .ok_or_else(|| anyhow::anyhow!("tpl_100k and tpl_1m were not seeded in this run"))
    }

    /// `tpl_1m` (seeded for the idle and scaling figures).
    pub fn t1m(&self) -> Result<&Template> {
        Ok(&self.large()?.t1m)
    }

    pub fn backlog(&self, backlog: Backlog) -> Result<DueSet<'_>> {
        Ok(match backlog {
            Backlog::TenK => DueSet {
                template: &self.t10k,
                as_of: self.t10k.as_of,
                due: self.due_10k,
            },
            Backlog::HundredK => {
                let large = self.large()?;
                DueSet {
                    template: &large.t100k,
                    as_of: large.t100k.as_of,
                    due: large.due_100k,
                }
            }
            Backlog::TenKOfOneM => {
                let large = self.large()?;
                DueSet {
                    template: &large.t1m,
                    as_of: one_day_later(&large.t1m),
                    due: large.due_1m_10k,
                }
            }
        })
    }
}

fn one_day_later(template: &Template) -> DateTime<Utc> {
    template.as_of + chrono::Duration::days(1)
}

async fn build(svc: &Services, name: &str, plan: &SeedPlan) -> Result<Template> {
    let started = Instant::now();
    svc.admin_exec(&format!("CREATE DATABASE {name}")).await?;
    let url = svc.url_of(name);
    db::migrate::run_migrations(&db_settings(&url, 1)).await?;
    let mut conn = AsyncPgConnection::establish(&url).await?;
    let rows = db::seed::seed(&mut conn, plan).await?;
    // Hint bits, visibility map and statistics set once, copied to every run.
    conn.batch_execute("VACUUM ANALYZE").await?;
    drop(conn);
    svc.wait_idle(name).await?;
    progress!(
        "template {name}: {rows} bookings ({} active, {} due at as_of, {} inactive) in {:.1} s",
        plan.active,
        plan.due(),
        plan.inactive,
        started.elapsed().as_secs_f64()
    );
    Ok(Template {
        name: name.into(),
        as_of: plan.as_of,
        rows,
    })
}

/// Due rows (both phases) at `as_of` in `db`.
pub async fn due_at(svc: &Services, db: &str, as_of: DateTime<Utc>) -> Result<u64> {
    let mut conn = AsyncPgConnection::establish(&svc.url_of(db)).await?;
    let mut total = 0;
    for phase in Phase::ALL {
        total += bookings::count_due(&mut conn, phase, as_of).await?;
    }
    drop(conn);
    svc.wait_idle(db).await?;
    Ok(total as u64)
}

fn plan(active: u64, due: u64, inactive: u64, as_of: DateTime<Utc>, spread_days: u64) -> SeedPlan {
    SeedPlan {
        active,
        due_fraction: due as f64 / active as f64,
        inactive,
        poison: 0,
        as_of,
        spread: Duration::from_secs(spread_days * 86_400),
    }
}
