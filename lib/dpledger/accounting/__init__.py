"""dpledger.accounting"""
