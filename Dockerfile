# loopwarden: the same install path as `make serve` (an editable install of this tree).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LOOPWARDEN_HOST=0.0.0.0 \
    LOOPWARDEN_DATABASE_URL=sqlite+aiosqlite:////data/loopwarden.db

RUN useradd --create-home --uid 10001 loopwarden && mkdir /data && chown loopwarden /data

WORKDIR /app
COPY pyproject.toml setup.py README.md alembic.ini ./
COPY proxy ./proxy
COPY migrations ./migrations
# The content layer's matcher and the request path's pure modules are compiled with gcc, installed for the build
# and removed after it (without it the install would still succeed, as plain Python: the same verdicts, slower).
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir -e . \
    && apt-get purge -y --auto-remove gcc libc6-dev && rm -rf /var/lib/apt/lists/*

USER loopwarden
WORKDIR /data
EXPOSE 8989
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD python -c "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8989/healthz', timeout=4).status != 200)"
CMD ["loopwarden", "serve"]
