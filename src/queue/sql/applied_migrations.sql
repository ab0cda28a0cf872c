-- applied_migrations: versions of the migrations applied successfully (readiness).
SELECT version FROM _sqlx_migrations WHERE success ORDER BY version
