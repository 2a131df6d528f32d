//! The spend report: what moved into SPENT, grouped by run, fork, model or tenant, over a
//! time range, from the transfers' attribution.

use crate::error::LedgerError;
use forkyard_proto::budget::v1::{
    GetSpendReportRequest, SpendGroupBy, SpendReport, SpendReportRow,
};
use sqlx::{AnyConnection, Row};

pub(crate) async fn spend_report(
    conn: &mut AnyConnection,
    req: &GetSpendReportRequest,
) -> Result<SpendReport, LedgerError> {
    let group = SpendGroupBy::try_from(req.group_by).map_err(|_| {
        LedgerError::invalid("group_by", format!("unknown grouping {}", req.group_by))
    })?;
    let column = match group {
        SpendGroupBy::Unspecified | SpendGroupBy::Run => "run_id",
        SpendGroupBy::Fork => "fork",
        SpendGroupBy::Model => "model",
        SpendGroupBy::Tenant => "tenant_id",
    };
    if req.from_unix_ms < 0 || req.to_unix_ms < 0 {
        return Err(LedgerError::invalid(
            "from_unix_ms",
            "times must not be negative",
        ));
    }
    if req.to_unix_ms != 0 && req.to_unix_ms <= req.from_unix_ms {
        return Err(LedgerError::invalid(
            "to_unix_ms",
            format!(
                "must be after from_unix_ms ({}), got {}",
                req.from_unix_ms, req.to_unix_ms
            ),
        ));
    }
    let to = if req.to_unix_ms == 0 {
        i64::MAX
    } else {
        req.to_unix_ms
    };
    let scope = if req.account_id.is_empty() {
        ""
    } else {
        " AND (account_id = $3 OR tenant_id = $3)"
    };
    // Spend of a run posts on the run's row with the tenant named in tenant_id, so a
    // tenant's report covers its runs and nothing counts twice.
    let sql = format!(
        "SELECT {column} AS k, CAST(SUM(spent_micros) AS BIGINT) AS spent, COUNT(*) AS n \
         FROM transfers WHERE spent_micros <> 0 AND created_unix_ms >= $1 AND created_unix_ms < $2{scope} \
         GROUP BY {column} ORDER BY {column}"
    );
    let mut q = sqlx::query(&sql).bind(req.from_unix_ms).bind(to);
    if !req.account_id.is_empty() {
        q = q.bind(&req.account_id);
    }
    let rows = q.fetch_all(&mut *conn).await?;
    let mut report = SpendReport::default();
    for row in rows {
        let r = SpendReportRow {
            key: row.try_get("k")?,
            spent_micros: row.try_get("spent")?,
            transfers: row.try_get("n")?,
        };
        report.total_spent_micros += r.spent_micros;
        report.rows.push(r);
    }
    Ok(report)
}
