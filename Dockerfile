# One image for every failslow service: `failslow <subcommand>` (detector, remediator, exporter).
# docker-compose.yml builds it once and gives each service its own command. No torch: the services never
# import it (the `testbed` extra is for the CPU cluster-in-a-box only), so the image is `pip install .`.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src

# Dependencies in their own layer, read from pyproject.toml: a code change then reuses the layer that holds
# numpy, scipy, pyarrow and the rest instead of downloading them again.
COPY pyproject.toml README.md ./
RUN python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" \
        > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt \
    && rm /tmp/requirements.txt

COPY failslow ./failslow
COPY failslow_cli ./failslow_cli
COPY exporter ./exporter
COPY detector ./detector
COPY remediator ./remediator
COPY testbed ./testbed
RUN pip install . \
    && cd / && rm -rf /src

# A fixed numeric uid, so that runAsNonRoot-style checks can verify it without reading /etc/passwd.
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/failslow \
        --shell /usr/sbin/nologin failslow
USER 10001:10001
WORKDIR /var/lib/failslow

# remediator (webhook, API, status page), detector (/metrics), exporter / node agent (/metrics)
EXPOSE 8000 9402 9400
ENTRYPOINT ["failslow"]
CMD ["--help"]
