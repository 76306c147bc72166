"""dpledger.models"""
