# rag-service API / worker image. CPU only.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    # The CPU build of torch; without it pip resolves torch to a multi-GB CUDA build.
    PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu \
    HF_HUB_OFFLINE=1

WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY rag_service ./rag_service
COPY ingestion ./ingestion
COPY evaluation ./evaluation
COPY migrations ./migrations
# Optional extras, e.g. --build-arg EXTRAS="[parse]" for RAGSVC_ANSWER_SHORT_ANSWER_PARSE.
ARG EXTRAS=""
RUN pip install ".${EXTRAS}" && useradd --create-home --uid 10001 ragsvc
USER ragsvc
# Local state (the ONNX export of the embedding model) where the non-root user may write.
ENV RAGSVC_DATA_DIR=/home/ragsvc/.ragsvc

EXPOSE 8000
# Ready: the database answers at the schema revision and the model is loaded (the first start exports
# the model to ONNX: minutes on a small machine).
HEALTHCHECK --interval=10s --timeout=5s --start-period=300s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=4)"]
# Migrate, then serve. RAGSVC_DATABASE_URL must point at PostgreSQL with pgvector. The compose file
# runs the migration once in its own service and the API replicas and the worker with other commands.
CMD ["sh", "-c", "ragsvc db upgrade && ragsvc serve --host 0.0.0.0 --port 8000"]
